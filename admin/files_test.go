package admin_test

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/admin"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

func TestFileCreateAndContent(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	// bytes_digest(b"hello") in Weave's algorithm (see weave/digest_test.go).
	const hello = "LPJNulXwow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ"
	for range 2 {
		if d := e.uploadFile(t, a, "team-a/p", "obj.py", []byte("hello")).object(t)["digest"]; d != hello {
			t.Fatalf("digest = %v, want %s", d, hello)
		}
	}
	binary := []byte{0, 0xff, 0xfe, '\n', 0}
	d := e.uploadFile(t, a, "team-a/p", "img.png", binary).object(t)["digest"].(string)
	for digest, want := range map[string][]byte{hello: []byte("hello"), d: binary} {
		r := e.ok("POST", "/file/content", a, `{"project_id":"team-a/p","digest":"`+digest+`"}`)
		if !bytes.Equal(r.body, want) || r.contentType != "application/octet-stream" {
			t.Fatalf("content of %s = %q (%s), want %q", digest, r.body, r.contentType, want)
		}
	}
	if r := e.do("POST", "/file/content", a, `{"project_id":"team-a/other","digest":"`+hello+`"}`); r.status != fasthttp.StatusNotFound {
		t.Fatalf("another project's file: status %d", r.status)
	}
	if r := e.doRaw(t, "POST", "/file/create", a, "application/json", []byte(`{"project_id":"team-a/p"}`)); r.status != fasthttp.StatusUnprocessableEntity {
		t.Fatalf("JSON body: status %d: %s", r.status, r.body)
	}
}

// TestFileSizeBound: a file over traces.max_file_bytes is refused with 413
// and not stored.
func TestFileSizeBound(t *testing.T) {
	db := storetest.OpenOne(t)
	kr, err := auth.NewKeyring(config.Auth{Keys: []config.Key{{Name: "alice", Key: aliceKey, Teams: []string{"team-a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	e := serveEnv(t, db, admin.New(admin.Options{Keys: kr, Store: db, MaxFileBytes: 8}))
	if r := e.uploadFile(t, bearer(aliceKey), "team-a/p", "f", []byte("12345678")); r.status != fasthttp.StatusOK {
		t.Fatalf("8 bytes: status %d: %s", r.status, r.body)
	}
	r := e.uploadFile(t, bearer(aliceKey), "team-a/p", "f", []byte("123456789"))
	if r.status != fasthttp.StatusRequestEntityTooLarge {
		t.Fatalf("9 bytes: status %d: %s", r.status, r.body)
	}
	// bytes_digest(b"123456789") is not stored.
	const nine = "FeKw08M4keuw8e9gnsQZQgwg4yDOlMZfvIwzEkSOsiU"
	if r := e.do("POST", "/file/content", bearer(aliceKey), `{"project_id":"team-a/p","digest":"`+nine+`"}`); r.status != fasthttp.StatusNotFound {
		t.Fatalf("the refused file was stored: status %d", r.status)
	}
}

// TestFileContentIsNotJSON: a file's bytes are stored whatever they hold,
// even what the JSON bounds refuse in a JSON body (an escaped NUL in
// source code, brackets nested past the depth bound).
func TestFileContentIsNotJSON(t *testing.T) {
	e := newEnv(t)
	for _, content := range [][]byte{
		[]byte(`const s = "\u0000";`),
		bytes.Repeat([]byte("["), 200),
	} {
		r := e.uploadFile(t, bearer(aliceKey), "team-a/p", "obj.py", content)
		if r.status != fasthttp.StatusOK {
			t.Fatalf("%q: status %d: %s", content[:10], r.status, r.body)
		}
		back := e.ok("POST", "/file/content", bearer(aliceKey), `{"project_id":"team-a/p","digest":"`+r.object(t)["digest"].(string)+`"}`)
		if !bytes.Equal(back.body, content) {
			t.Fatalf("content = %q", back.body)
		}
	}
}
