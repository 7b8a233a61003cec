package store_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/trace"
)

// TestOpNamePrefixFilter checks that "name:*" in op_names selects the op
// name itself and every "name:<version>", and nothing else, whatever the
// name's characters: the prefix is compared as bytes, not counted in bytes
// against a function that counts characters, and no character of it is a
// pattern.
func TestOpNamePrefixFilter(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "names")
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]string{
			"cafe-v1":   "weave:///acme/names/op/café:v1",
			"cafe-bare": "weave:///acme/names/op/café",
			"cafe-long": "weave:///acme/names/op/cafés:v1",
			"cafe-e":    "weave:///acme/names/op/cafe:v1",
			"jp-v1":     "日本:v1",
			"jp-v2":     "日本:日本",
			"jp-more":   "日本語:v1",
			"emoji-v1":  "op🙂:abc",
			"pct-v1":    "a%b_c:v1",
			"pct-decoy": "aXbYc:v1",
			"colon":     "x:y:v1",
		}
		var writes []trace.CallWrite
		for id, name := range names {
			writes = append(writes, trace.CallWrite{Start: &trace.CallStart{
				ProjectID: p.ID, ID: id, OpName: name, TraceID: "t", StartedAt: callT0,
			}})
		}
		if _, err := db.WriteCalls(ctx, writes); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			opNames []string
			want    []string
		}{
			{[]string{"weave:///acme/names/op/café:*"}, []string{"cafe-bare", "cafe-v1"}},
			{[]string{"日本:*"}, []string{"jp-v1", "jp-v2"}},
			{[]string{"op🙂:*"}, []string{"emoji-v1"}},
			{[]string{"a%b_c:*"}, []string{"pct-v1"}},
			{[]string{"x:*"}, []string{"colon"}},
			{[]string{"x:y:*"}, []string{"colon"}},
			{[]string{"日:*", "caf:*"}, []string{}},
			{[]string{"日本:*", "weave:///acme/names/op/cafe:v1"}, []string{"cafe-e", "jp-v1", "jp-v2"}},
		}
		for _, tt := range tests {
			f := trace.CallsFilter{OpNames: tt.opNames}
			got := selectIDs(t, db, p, trace.CallsQuery{Filter: &f, Limit: -1,
				SortBy: []trace.SortBy{{Field: trace.GetField{Column: "id"}}}})
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%s: op_names %q selected %v, want %v", db.Engine(), tt.opNames, got, tt.want)
			}
		}
	})
}
