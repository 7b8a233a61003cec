package route

import (
	"reflect"
	"testing"
)

func TestMatch(t *testing.T) {
	tests := []struct {
		pattern, path string
		want          map[string]string
		ok            bool
	}{
		{"/health", "/health", nil, true},
		{"/health", "/health/", nil, false},
		{"/v2/{entity}/{project}/ops", "/v2/acme/p/ops", map[string]string{"entity": "acme", "project": "p"}, true},
		{"/v2/{entity}/{project}/ops", "/v2/acme//ops", nil, false},
		{"/v2/{entity}/{project}/ops", "/v2/acme/p/ops/x", nil, false},
		{"/v2/{entity}/{project}/ops/{id}", "/v2/acme/p/ops/", nil, false},
		{"/v2/{entity}/{project}/evaluation_runs/{id}/finish", "/v2/a/b/evaluation_runs/r1/finish",
			map[string]string{"entity": "a", "project": "b", "id": "r1"}, true},
		{"/v2/{entity}/{project}/evaluation_runs/{id}/finish", "/v2/a/b/evaluation_runs/r1/other", nil, false},
		{"/v1/models/{id...}", "/v1/models/org/model", map[string]string{"id": "org/model"}, true},
		{"/v1/models/{id...}", "/v1/models/", nil, false},
		{"/ui/{path...}", "/ui/static/app.js", map[string]string{"path": "static/app.js"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+" "+tt.path, func(t *testing.T) {
			got, ok := Match(tt.pattern, tt.path)
			if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Match = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}
