package proxy

import (
	"github.com/tollgate-dev/tollgate/anthropic"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/internal/finish"
	"github.com/tollgate-dev/tollgate/openai"
	"github.com/tollgate-dev/tollgate/translate"
)

// messagesStream is what a Messages API stream adds to the stream body: a
// native stream's events go through anthropic's processor, which reads
// their usage and renames the model in message_start; a chat stream is
// accounted by openai's, as chat's, and translated, event by event, into
// Anthropic's.
type messagesStream struct {
	// on says the stream is a Messages API stream.
	on     bool
	native bool
	events anthropic.EventProcessor
	// translated turns a chat stream into the client's events.
	translated translate.Stream
}

// startMessages readies the stream body for a Messages API stream of c
// from b: served is the model a translated stream names, replyModel the
// quoted one a native stream's message_start names (nil: the backend's).
func (sb *streamBody) startMessages(c *exchange, b *backends.Backend, served string, replyModel []byte) {
	m := &sb.messages
	m.on, m.native = true, c.native
	if c.native {
		m.events.Reset(anthropic.StreamOptions{PublicModel: replyModel, Backend: b.Name, Redact: redactInBand})
		return
	}
	m.translated.Reset(served)
	// Nothing is stripped from the chat events (see validateMessages), and
	// the model is named by the translation.
	sb.events.Reset(openai.StreamOptions{Backend: b.Name})
}

// process appends to dst what the client receives for one upstream event,
// from the processor of the stream's wire.
func (sb *streamBody) process(dst, ev []byte) []byte {
	m := &sb.messages
	switch {
	case !m.on:
		return sb.events.Process(dst, ev)
	case m.native:
		return m.events.Process(dst, ev)
	}
	// openai's processor keeps the usage, the id and the count of deltas;
	// its output, the chat event itself, is replaced by the translation.
	n := len(dst)
	dst = sb.events.Process(dst, ev)[:n]
	switch {
	case sb.events.UsageErr() != nil:
		return dst // the stream ends with the gateway's error (see endUpstream)
	case sb.events.ErrorMessage() != "":
		return m.translated.Fail(dst, &anthropic.Error{Type: anthropic.APIError, Message: anthropic.StreamErrorMessage(sb.backend.Name)})
	}
	return m.translated.Event(dst, ev)
}

// streamFacts are what the stream's processor learnt, which settle
// records.
type streamFacts struct {
	usage        openai.UsageCounts
	outputTokens int64
	// cacheWrite are the prompt tokens a native stream reported written
	// to the cache, which chat's counts have no place for.
	cacheWrite int64
	replyID    string
	created    int64
	finish     finish.Reasons
	// errMessage is the backend's in-band error, "" when none came.
	errMessage string
	// usageErr is why a usage block was refused.
	usageErr error
}

// facts reads the facts of the stream from the processor that ran.
func (sb *streamBody) facts() streamFacts {
	if m := &sb.messages; m.on && m.native {
		u := m.events.Usage()
		return streamFacts{usage: messagesUsage(u), outputTokens: m.events.OutputTokens(), cacheWrite: u.CacheCreation,
			replyID: openai.BackendID(m.events.ReplyID()), finish: m.events.FinishReasons(), errMessage: m.events.ErrorMessage(),
			usageErr: m.events.UsageErr()}
	}
	f := streamFacts{usage: sb.events.Usage(), outputTokens: sb.events.OutputTokens(), finish: sb.events.FinishReasons(),
		errMessage: sb.events.ErrorMessage(), usageErr: sb.events.UsageErr()}
	f.replyID, f.created = sb.events.ReplyKey()
	if sb.messages.on && f.replyID != "" {
		// An Anthropic message carries no date, so a Weave SDK's trace of
		// it names it undated (fold.CompletionOf): the record does too.
		f.replyID, f.created = translate.MessageID(f.replyID), 0
	}
	return f
}

// usageErr is why the stream's processor refused a usage block, or nil.
func (sb *streamBody) usageErr() error {
	if m := &sb.messages; m.on && m.native {
		return m.events.UsageErr()
	}
	return sb.events.UsageErr()
}

// done reports whether the stream's own end came.
func (sb *streamBody) done() bool {
	if m := &sb.messages; m.on && m.native {
		return m.events.Done()
	}
	return sb.events.Done()
}

// messagesUsage is what a Messages API usage is charged as: the prompt is
// the input with the tokens read from and written to the cache, of which
// the reads are the cached tokens (the writes, u.CacheCreation, are the
// record's CacheWriteTokens).
func messagesUsage(u anthropic.Usage) openai.UsageCounts {
	prompt := u.Prompt()
	return openai.UsageCounts{Input: prompt, Output: u.Output, Total: prompt + u.Output, Cached: u.CacheRead, Reported: u.Reported}
}

// redactInBand is what the record keeps of a backend's in-band error
// message: clipped, with anything shaped like a credential replaced.
func redactInBand(s string) string { return openai.Clip(openai.RedactCredentials(s)) }

// appendMessagesError appends the in-band error event that ends a Messages
// API stream the gateway cannot complete: Anthropic's shape, no [DONE].
func appendMessagesError(dst []byte, e *openai.Error) []byte {
	return anthropic.AppendErrorEvent(dst, &anthropic.Error{Type: anthropic.APIError, Message: e.Message})
}
