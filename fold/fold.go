// Package fold is the rule that joins usage to the trace service: one
// completion, one call.
//
// When a Weave SDK traces a completion that went through the gateway, two
// writers describe it: the gateway records its call (asynchronously, in the
// usage writer's batches), and the SDK logs its own, whose output carries
// the completion id the gateway returned. They are folded into the SDK's
// call, in the SDK's trace, which takes the gateway's attributes under
// attributes.gateway; the gateway's call is not kept. Without an SDK call
// the gateway's call stands alone.
//
// The fold happens at ingest rather than at query time, so that every
// reader (calls queries, usage roll-ups, query stats, exports) sees one row
// and a project's roll-up cannot count the completion twice. Either writer
// may come first, so each asks this package what to do with the link the
// other may have left: the store keeps the links (one per completion) and
// executes the answer.
//
// A link never crosses entities: the SDK call's team must be the gateway
// call's team, so that nobody can pull another team's call into a trace by
// naming its completion id.
package fold

import (
	"fmt"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tollgate-dev/tollgate/internal/jsonmerge"
)

// Completion names one completion: its id and its own date (unix seconds,
// set by the backend: "created", or "created_at" for a response; 0 when
// absent). Both writers read it from the same object, so they agree on it.
type Completion struct {
	ID      string
	Created int64
}

// Holder is who holds a completion's link.
type Holder uint8

const (
	// Nobody holds it: the writer asking takes it.
	Nobody Holder = iota
	// Gateway holds it: the gateway recorded the completion first.
	Gateway
	// SDK holds it: an SDK call ended with the completion as its output.
	SDK
)

// Action is what a writer does once it knows the link's holder.
type Action uint8

const (
	// Link: the writer takes the link; its call stands alone for now.
	Link Action = iota
	// FoldGateway: the gateway's call folds into the SDK call (its
	// attributes go under the SDK call's attributes.gateway, its row is
	// deleted) and the link becomes the SDK call's.
	FoldGateway
	// Keep: the link is someone else's already and stays so; the writer's
	// call is kept as it is.
	Keep
)

// OnSDKEnd is what an SDK call that ended with a completion does, given
// the completion link's holder.
func OnSDKEnd(h Holder) Action {
	switch h {
	case Gateway:
		return FoldGateway
	case SDK:
		// Another SDK call (or this one, ending again) holds it.
		return Keep
	}
	return Link
}

// OnGatewayRecord is what the gateway's record of a completion does, given
// the completion link's holder.
func OnGatewayRecord(h Holder) Action {
	if h == SDK {
		return FoldGateway
	}
	return Link
}

// OTelSource is the attributes.weave.source of a call ingested from an
// OpenTelemetry span (POST /otel/v1/traces).
const OTelSource = "otel"

// IsSDKSource reports whether an attributes.weave.source value names a
// Weave SDK.
func IsSDKSource(source string) bool { return source == "js-sdk" || source == "python-sdk" }

// IsClientSource reports whether an attributes.weave.source value names a
// client's tracer, a Weave SDK or an OpenTelemetry exporter: its calls are
// the ones a gateway call folds into, and their summaries are cumulative
// (see SummaryHoldsChild).
func IsClientSource(source string) bool { return IsSDKSource(source) || source == OTelSource }

// IsClientCall reports whether a call's attributes say a client's tracer
// logged it (IsClientSource).
func IsClientCall(attributes []byte) bool {
	return IsClientSource(gjson.GetBytes(attributes, "weave.source").Str)
}

// SummaryHoldsChild reports whether the summary.usage of a call of source
// parent already holds that of its child of source child, so that the
// roll-up takes the parent's own usage to be its summary minus those
// children's. A Weave SDK adds each SDK child's summary into its parent's.
// OpenTelemetry instrumentations repeat the usage of the spans below on the
// span above (the AI SDK's ai.generateText over ai.generateText.doGenerate,
// invoke_agent over chat): an ingested span's usage is taken to hold all
// its children's, whatever logged them (a gateway completion that names the
// span as its parent is the span's request).
func SummaryHoldsChild(parent, child string) bool {
	switch {
	case parent == OTelSource:
		return true
	case IsSDKSource(parent):
		return IsSDKSource(child)
	}
	return false
}

// CompletionOf returns the completion a traced call's output stands for (an
// OpenAI chat completion, streamed or not, a text completion or a response;
// an Anthropic message), and false when it stands for none. It reads the reply by the
// gateway's own rule; the Weave SDK's reduction of a stream keeps the last
// chunk's "created" that is not 0, as the gateway does.
//
// The Weave JS SDK logs a streamed response as {"responses":[…]}: its
// reducer starts a response at each response.created, which carries the
// response object whole, and completes it with the later events. The
// completion is read from the one response only when there is exactly one:
// an output of several is not one completion, so no single gateway call is
// its to take.
func CompletionOf(output []byte) (Completion, bool) {
	if len(output) == 0 || output[0] != '{' {
		return Completion{}, false
	}
	obj := gjson.ParseBytes(output)
	if rs := obj.Get("responses"); rs.IsArray() && !obj.Get("id").Exists() {
		n := 0
		rs.ForEach(func(_, v gjson.Result) bool {
			obj, n = v, n+1
			return n < 2
		})
		if n != 1 || !obj.IsObject() {
			return Completion{}, false
		}
	}
	r := gjson.GetMany(obj.Raw, "id", "object", "created", "created_at", "type")
	if r[0].Type != gjson.String || r[0].Str == "" {
		return Completion{}, false
	}
	switch r[1].Str {
	case "chat.completion", "chat.completion.chunk", "text_completion":
		return Completion{r[0].Str, r[2].Int()}, true
	case "response":
		return Completion{r[0].Str, r[3].Int()}, true
	case "":
		// An Anthropic Messages reply names its kind in "type" and
		// carries no date, so both writers key it at 0.
		if r[4].Str == "message" {
			return Completion{r[0].Str, 0}, true
		}
	}
	return Completion{}, false
}

// Attributes returns the SDK call's attributes with the gateway call's
// folded in: the gateway's attributes, with its call id, under "gateway",
// merged as a JSON merge patch so that both engines store the same text.
func Attributes(sdk, gateway []byte, gatewayCallID string) ([]byte, error) {
	gw, err := sjson.SetBytes(gateway, "call_id", gatewayCallID)
	if err != nil {
		return nil, fmt.Errorf("fold gateway call: %w", err)
	}
	patch := make([]byte, 0, len(gw)+16)
	patch = append(append(append(patch, `{"gateway":`...), gw...), '}')
	merged, err := jsonmerge.Patch(sdk, patch)
	if err != nil {
		return nil, fmt.Errorf("fold gateway call: %w", err)
	}
	return merged, nil
}

// Span dates: an OpenTelemetry span names its completion by
// gen_ai.response.id, but rarely by its date, which the link's key holds
// (the AI SDK's ai.response.timestamp is the one that does). The backend
// dates a completion while the span is open, most often in the second the
// span started or the next few.
const (
	// spanClaimSeconds is how many seconds from the span's start an
	// ingested span claims the completion for, when it does not know the
	// date: a gateway record that comes later, dated one of them, folds in.
	spanClaimSeconds = 4
)

// SpanDates returns where the link of the completion an ingested span
// reports may be: a link the gateway made already is looked for dated
// from first to last (unix seconds), and otherwise the span claims the
// completion at each of the dates claim. created is the completion's own
// date when the span carries it (0 otherwise), start and end the span's.
func SpanDates(created int64, start, end time.Time) (first, last int64, claim []int64) {
	if created > 0 {
		return created, created, []int64{created}
	}
	first, last = start.Unix(), max(end.Unix(), start.Unix())
	for d := first; d <= last && d < first+spanClaimSeconds; d++ {
		claim = append(claim, d)
	}
	return first, last, claim
}
