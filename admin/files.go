package admin

import (
	"context"
	"io"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/weave"
)

// defaultMaxFileBytes bounds a stored file when config leaves
// traces.max_file_bytes zero.
const defaultMaxFileBytes = 32 << 20

// fileCreate serves POST /file/create, multipart/form-data with the fields
// project_id and file. Files are content-addressed: the same content gets
// the same digest and is stored once per project.
func (s *Service) fileCreate(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	var v validation
	form, err := rc.MultipartForm()
	if err != nil {
		v.add(bodyLoc, "value_error", "Value error, the body must be multipart/form-data with the fields project_id and file: "+err.Error(), nil)
		return v.err()
	}
	projectID := ""
	if vals := form.Value["project_id"]; len(vals) > 0 {
		projectID = vals[0]
	} else {
		v.add(at(bodyLoc, "project_id"), "missing", "Field required", nil)
	}
	files := form.File["file"]
	if len(files) == 0 {
		v.add(at(bodyLoc, "file"), "missing", "Field required", nil)
	}
	if v.failed() {
		return v.err()
	}
	fh := files[0]
	if fh.Size > s.maxFileBytes {
		return &apiError{status: fasthttp.StatusRequestEntityTooLarge,
			detail: "The file is " + strconv.FormatInt(fh.Size, 10) + " bytes; the limit is " + strconv.FormatInt(s.maxFileBytes, 10) + " bytes (traces.max_file_bytes)"}
	}
	proj, _, e := s.resolveProject(ctx, key, projectID, at(bodyLoc, "project_id"), forWrite)
	if e != nil {
		return e
	}
	f, err := fh.Open()
	if err != nil {
		return internalError(err)
	}
	defer f.Close()
	content, err := io.ReadAll(io.LimitReader(f, s.maxFileBytes+1))
	if err != nil {
		return internalError(err)
	}
	if int64(len(content)) > s.maxFileBytes {
		return &apiError{status: fasthttp.StatusRequestEntityTooLarge,
			detail: "The file exceeds the limit of " + strconv.FormatInt(s.maxFileBytes, 10) + " bytes (traces.max_file_bytes)"}
	}
	digest := weave.BytesDigest(content)
	if err := s.weave.PutFile(ctx, proj.ID, weave.File{Digest: digest, Content: content}); err != nil {
		return internalError(err)
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]string{"digest": digest})
	return nil
}

// fileContent serves POST /file/content {project_id, digest} with the
// file's bytes.
func (s *Service) fileContent(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	digest, projectID, e := s.digestRequest(ctx, rc, key, "File")
	if e != nil {
		return e
	}
	content, err := s.weave.ReadFile(ctx, projectID, digest)
	if e := lookupError(err, "File "+digest); e != nil {
		return e
	}
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetContentType("application/octet-stream")
	// Stored bytes are whatever a client uploaded: never let a browser
	// render them as a page of the gateway's origin (the dashboard's).
	rc.Response.Header.Set("X-Content-Type-Options", "nosniff")
	rc.Response.Header.Set("Content-Disposition", "attachment")
	rc.SetBody(content)
	return nil
}
