package admin_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"mime/multipart"
	"testing"

	"github.com/valyala/fasthttp"
)

// uploadFile sends POST /file/create as the SDKs do: multipart/form-data
// with project_id and file.
func (e *env) uploadFile(t *testing.T, authz, projectID, name string, content []byte) response {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if err := w.WriteField("project_id", projectID); err != nil {
		t.Fatal(err)
	}
	fw, err := w.CreateFormFile("file", name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fw.Write(content); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return e.doRaw(t, "POST", "/file/create", authz, w.FormDataContentType(), buf.Bytes())
}

// doRaw is do with a body of any content type.
func (e *env) doRaw(t *testing.T, method, path, authz, contentType string, body []byte) response {
	t.Helper()
	conn, err := e.ln.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI("http://tollgate" + path)
	if authz != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, authz)
	}
	req.Header.SetContentType(contentType)
	req.SetBody(body)
	req.SetConnectionClose()
	bw := bufio.NewWriter(conn)
	if err := req.Write(bw); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(conn)); err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode(), body: append([]byte(nil), resp.Body()...), contentType: string(resp.Header.ContentType())}
}

// expect422 sends body to path as alice and checks that the first error
// of the 422 is at loc (JSON) with type typ.
func (e *env) expect422(t *testing.T, path, body, loc, typ string) {
	t.Helper()
	r := e.do("POST", path, bearer(aliceKey), body)
	if r.status != fasthttp.StatusUnprocessableEntity {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	detail, ok := r.object(t)["detail"].([]any)
	if !ok || len(detail) == 0 {
		t.Fatalf("no detail list: %s", r.body)
	}
	first := detail[0].(map[string]any)
	if got := compact(t, first["loc"]); got != loc || first["type"] != typ {
		t.Fatalf("first error at %s of type %v, want %s of type %s: %s", got, first["type"], loc, typ, r.body)
	}
}

// compact is v as compact JSON.
func compact(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
