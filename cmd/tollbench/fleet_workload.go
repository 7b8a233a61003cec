package main

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// fleetWorkload is the chat workload of -fleet (issue 35): conversations over a few apps, each
// app with a long system prompt of its own, a conversation's turns sent one after another with
// a think time between them, as users of chat apps send them. Everything it says is a function
// of its seed and of a conversation's number, so every side of a run replays the same script.
type fleetWorkload struct {
	seed uint64
	apps []string // the system prompts
	// turns, userWords and replyTokens bound each conversation's length, its user messages and
	// its replies (max_tokens), drawn uniformly.
	minTurns, maxTurns int
	minWords, maxWords int
	minReply, maxReply int
	// think is the mean think time between a reply and the next turn (exponential).
	think time.Duration
}

// fleetShape is what the workload is made of.
type fleetShape struct {
	apps, promptWords int
	think             time.Duration
}

func newFleetWorkload(seed uint64, s fleetShape) *fleetWorkload {
	w := &fleetWorkload{
		seed: seed, minTurns: 3, maxTurns: 8, minWords: 20, maxWords: 80, minReply: 16, maxReply: 48, think: s.think,
	}
	for a := range s.apps {
		r := rand.New(rand.NewPCG(seed, uint64(a)+1<<32))
		var b strings.Builder
		b.WriteString("You are the assistant of app " + strconv.Itoa(a) + ".")
		for range s.promptWords {
			b.WriteString(" ")
			b.WriteString(word(r))
		}
		w.apps = append(w.apps, b.String())
	}
	return w
}

// word is a made-up word of 3 to 8 letters.
func word(r *rand.Rand) string {
	var b [8]byte
	n := 3 + r.IntN(6)
	for i := range n {
		b[i] = byte('a' + r.IntN(26))
	}
	return string(b[:n])
}

// fleetTurn is one request of a conversation.
type fleetTurn struct {
	user      string
	maxTokens int
	// think is the pause before this turn is sent (after the previous reply, or the
	// conversation's start).
	think time.Duration
}

// fleetConversation is one conversation of the script.
type fleetConversation struct {
	id    int
	app   int
	turns []fleetTurn
	// session, when not zero, opens its app's system prompt: -fleet numbers each phase's
	// conversations apart, so that the gateway's prefix index, which no cache reset reaches,
	// finds nothing of an earlier phase's prompts on the servers' reset caches, as a gateway
	// in service never meets the same conversation twice.
	session int
}

// conversation returns conversation i of the script.
func (w *fleetWorkload) conversation(i int) fleetConversation {
	r := rand.New(rand.NewPCG(w.seed, uint64(i)))
	c := fleetConversation{id: i, app: r.IntN(len(w.apps))}
	n := w.minTurns + r.IntN(w.maxTurns-w.minTurns+1)
	for range n {
		words := w.minWords + r.IntN(w.maxWords-w.minWords+1)
		var b strings.Builder
		for k := range words {
			if k > 0 {
				b.WriteString(" ")
			}
			b.WriteString(word(r))
		}
		c.turns = append(c.turns, fleetTurn{
			user:      b.String(),
			maxTokens: w.minReply + r.IntN(w.maxReply-w.minReply+1),
			think:     time.Duration(r.ExpFloat64() * float64(w.think)),
		})
	}
	return c
}

// chatMessage is a message of a request body.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// body returns the streamed request of turn t (0-based) of c: the app's system prompt, the
// earlier turns with the replies the simulated servers give them ("tok0 tok1 …"), and turn t.
func (w *fleetWorkload) body(model string, c fleetConversation, t int, priority int) []byte {
	system := w.apps[c.app]
	if c.session != 0 {
		system = fmt.Sprintf("Session %04d. %s", c.session, system)
	}
	msgs := []chatMessage{{Role: "system", Content: system}}
	for k := range t + 1 {
		msgs = append(msgs, chatMessage{Role: "user", Content: c.turns[k].user})
		if k < t {
			msgs = append(msgs, chatMessage{Role: "assistant", Content: simulatedReply(c.turns[k].maxTokens)})
		}
	}
	return requestBody(model, msgs, c.turns[t].maxTokens, priority)
}

// requestBody renders a streamed chat completion request asking for usage. A zero priority is
// left out, as a client that does not use priorities sends none.
func requestBody(model string, msgs []chatMessage, maxTokens, priority int) []byte {
	type streamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	}
	b, err := json.Marshal(struct {
		Model         string        `json:"model"`
		Messages      []chatMessage `json:"messages"`
		MaxTokens     int           `json:"max_tokens"`
		Stream        bool          `json:"stream"`
		StreamOptions streamOptions `json:"stream_options"`
		Priority      int           `json:"priority,omitempty"`
	}{model, msgs, maxTokens, true, streamOptions{true}, priority})
	if err != nil {
		panic(err) // strings and ints always marshal
	}
	return b
}

// simulatedReply is the text a simulated server answers with n tokens: "tok0 tok1 … ".
func simulatedReply(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("tok")
		b.WriteString(strconv.Itoa(i))
		b.WriteString(" ")
	}
	return b.String()
}

// meanService estimates a request's time on a server from the engine's settings, at the
// middle of the workload's draws: prefill of a new turn's words (the rest cached) plus the
// reply's tokens, at the load factor's midpoint.
func (w *fleetWorkload) meanService(e fleetEngine) time.Duration {
	return w.serviceAt(e, 1+(e.loadFactor-1)/2)
}

// saturatedService is meanService with every server running max_num_seqs sequences, as in a
// saturated fleet: at the load factor's top, which is what bounds the fleet's capacity.
func (w *fleetWorkload) saturatedService(e fleetEngine) time.Duration {
	return w.serviceAt(e, max(e.loadFactor, 1))
}

// serviceAt is a request's time on a server, at the middle of the workload's draws, with its
// prefill and tokens slowed by factor.
func (w *fleetWorkload) serviceAt(e fleetEngine, factor float64) time.Duration {
	reply := (w.minReply + w.maxReply) / 2
	prefill := e.ttft + time.Duration((w.minWords+w.maxWords)/2+8)*e.prefillPerToken
	return time.Duration(float64(prefill+time.Duration(reply)*e.itl) * factor)
}

// thinkForBusy is the mean think time that keeps conversations closed-loop workers busy the
// share busy of the fleet's slots: each worker has one request in service for service out of
// every service+think, so slots×busy = workers×service/(service+think).
func thinkForBusy(workers, slots int, busy float64, service time.Duration) time.Duration {
	if busy <= 0 || slots <= 0 {
		return 0
	}
	ratio := float64(workers) / (float64(slots) * busy)
	return time.Duration(math.Max(ratio-1, 0) * float64(service))
}
