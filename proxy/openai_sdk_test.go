package proxy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate-dev/tollgate/backends/simulated"
)

// sdkClient is the official OpenAI Go SDK pointed at the gateway: the base
// URL is the only change a user makes.
func sdkClient(h *harness, key string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(h.base+"/v1/"),
		option.WithAPIKey(key),
		// Retries would hide the gateway's status codes from the test.
		option.WithMaxRetries(0),
	)
}

func sdkParams(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("say hello to me")},
		MaxTokens: openai.Int(4),
	}
}

func TestOpenAISDK(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{InterTokenDelay: 5 * time.Millisecond}})
	client := sdkClient(h, testKey)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("create", func(t *testing.T) {
		res, err := client.Chat.Completions.New(ctx, sdkParams("llama"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Model != "llama" || res.Choices[0].Message.Content != "tok0 tok1 tok2 tok3 " {
			t.Errorf("reply model %q content %q", res.Model, res.Choices[0].Message.Content)
		}
		if res.Usage.PromptTokens != helloPromptTokens || res.Usage.CompletionTokens != 4 || res.Usage.TotalTokens != helloPromptTokens+4 {
			t.Errorf("usage = %+v", res.Usage)
		}
	})

	for _, includeUsage := range []bool{false, true} {
		name := "stream without include_usage"
		params := sdkParams("demo")
		if includeUsage {
			name = "stream with include_usage"
			params.StreamOptions.IncludeUsage = openai.Bool(true)
		}
		t.Run(name, func(t *testing.T) {
			stream := client.Chat.Completions.NewStreaming(ctx, params)
			var content strings.Builder
			var usage openai.CompletionUsage
			for stream.Next() {
				chunk := stream.Current()
				if chunk.Model != "demo" {
					t.Errorf("chunk model %q", chunk.Model)
				}
				if len(chunk.Choices) > 0 {
					content.WriteString(chunk.Choices[0].Delta.Content)
				}
				if chunk.Usage.TotalTokens > 0 {
					usage = chunk.Usage
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if content.String() != "tok0 tok1 tok2 tok3 " {
				t.Errorf("content = %q", content.String())
			}
			if includeUsage && usage.TotalTokens != helloPromptTokens+4 {
				t.Errorf("usage = %+v, want the usage chunk", usage)
			}
			if !includeUsage && usage.TotalTokens != 0 {
				t.Errorf("client did not ask for usage but got %+v", usage)
			}
		})
	}

	t.Run("in-band stream error is raised", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(ctx, sdkParams("demo"), option.WithHeader("X-Mock-Fail-After", "1"))
		for stream.Next() {
		}
		if stream.Err() == nil {
			t.Fatal("the SDK saw no error for an in-band stream error")
		}
	})

	errorCases := []struct {
		name   string
		client openai.Client
		params openai.ChatCompletionNewParams
		opts   []option.RequestOption
		status int
		code   string
	}{
		{"wrong key", sdkClient(h, "sk-wrong"), sdkParams("demo"), nil, 401, "invalid_api_key"},
		{"unknown model", client, sdkParams("nope"), nil, 404, "model_not_found"},
		{"invalid body", client, func() openai.ChatCompletionNewParams {
			p := sdkParams("demo")
			p.Temperature = openai.Float(7)
			return p
		}(), nil, 400, ""},
		{"backend overloaded", client, sdkParams("demo"), []option.RequestOption{option.WithHeader("X-Mock-Status", "503")}, 503, "upstream_error"},
	}
	for _, tt := range errorCases {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.client.Chat.Completions.New(ctx, tt.params, tt.opts...)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v, want *openai.Error", err)
			}
			if apiErr.StatusCode != tt.status || apiErr.Code != tt.code || apiErr.Message == "" {
				t.Errorf("status %d code %q message %q, want %d %q", apiErr.StatusCode, apiErr.Code, apiErr.Message, tt.status, tt.code)
			}
		})
	}
}
