package admin_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestRefsReadBatchIsBounded: a small batch naming one large object many
// times is refused with a 413 before its answer is built, instead of a
// reply a thousand times the object; a batch within the bound answers
// every ref, a repeated one with the same value.
func TestRefsReadBatchIsBounded(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		a := bearer(aliceKey)
		big := strings.Repeat("x", 100<<10)
		digest := e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"big","val":{"blob":"`+big+`"}}}`).object(t)["digest"].(string)
		ref := "weave:///team-a/p/object/big:" + digest
		small := e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"small","val":{"k":"v"}}}`).object(t)["digest"].(string)
		sref := "weave:///team-a/p/object/small:" + small

		refs := make([]string, 1000)
		for i := range refs {
			refs[i] = ref
		}
		body := `{"refs":["` + strings.Join(refs, `","`) + `"]}`
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := e.do("POST", "/refs/read_batch", a, body)
		runtime.ReadMemStats(&after)
		if r.status != fasthttp.StatusRequestEntityTooLarge {
			t.Fatalf("1000 refs to a 100 KiB object (a %d-byte request): status %d, %d bytes of answer; want 413",
				len(body), r.status, len(r.body))
		}
		if d := r.object(t)["detail"].(string); !strings.Contains(d, "read fewer refs per batch") {
			t.Errorf("detail %q does not say what to do", d)
		}
		// The whole reply would be 100 MB; what the request allocated
		// stays within a few times the bound.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
			t.Errorf("the refused batch allocated %d bytes", alloc)
		}

		vals := e.ok("POST", "/refs/read_batch", a, `{"refs":["`+sref+`","`+ref+`","`+sref+`","`+ref+`/key/blob"]}`).object(t)["vals"].([]any)
		want := []string{`{"k":"v"}`, `{"blob":"` + big + `"}`, `{"k":"v"}`, `"` + big + `"`}
		if len(vals) != len(want) {
			t.Fatalf("%d vals, want %d", len(vals), len(want))
		}
		for i, w := range want {
			if got := compact(t, vals[i]); got != w {
				t.Errorf("val %d = %.80s, want %.80s", i, got, w)
			}
		}
	})
}
