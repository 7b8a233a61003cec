package admin

import (
	"context"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/route"
	"github.com/tollgate-dev/tollgate/trace"
)

// panickyStore panics where a store might choke on what it read.
type panickyStore struct{ trace.Store }

func (panickyStore) FindProject(context.Context, string, string) (trace.Project, error) {
	panic("store choked")
}

func TestHandlerPanicIsA500NotACrash(t *testing.T) {
	kr, err := auth.NewKeyring(config.Auth{Keys: []config.Key{{Name: "alice", Key: "sk-alice", Teams: []string{"team-a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.ErrorLevel)
	s := New(Options{Keys: kr, Store: panickyStore{}, Log: zap.New(core)})
	var rc fasthttp.RequestCtx
	rc.Request.Header.SetMethod("POST")
	rc.Request.SetRequestURI("http://tollgate/call/read")
	rc.Request.Header.Set("Authorization", "Bearer sk-alice")
	rc.Request.SetBodyString(`{"project_id":"team-a/p","id":"x"}`)
	router, err := route.New(s.Routes(), NotFound, MethodNotAllowed)
	if err != nil {
		t.Fatal(err)
	}
	router.Serve(&rc)
	if rc.Response.StatusCode() != fasthttp.StatusInternalServerError || string(rc.Response.Body()) != `{"detail":"Internal server error"}`+"\n" {
		t.Errorf("answered %d %q, want a plain 500", rc.Response.StatusCode(), rc.Response.Body())
	}
	if logs.Len() != 1 || !strings.Contains(logs.All()[0].ContextMap()["error"].(string), "store choked") {
		t.Errorf("logged %v, want the panic", logs.All())
	}
}
