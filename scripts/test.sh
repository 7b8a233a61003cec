#!/usr/bin/env bash
# The whole test suite, as the README gives it: every Go package under the
# race detector, cmd/tollgate's TestClientSuite included, which runs the npm
# client suite (clients/: the official OpenAI SDK, the Vercel AI SDK,
# LangChain and the Weave SDK) against the real gateway binary.
#
# gotestsum (a tool dependency in go.mod) runs `go test` and closes with
# every skipped test and why it skipped, then one line of counts.
# Extra arguments go to `go test`, e.g. scripts/test.sh -run TestClientSuite.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -d clients/node_modules ]; then
	if command -v npm >/dev/null 2>&1; then
		echo "== npm ci --prefix clients (the npm client suite's packages, from clients/package-lock.json)"
		npm ci --prefix clients --no-audit --no-fund
	else
		echo "== npm not found: the npm client suite will be SKIPPED"
	fi
fi

exec go tool gotestsum --format pkgname-and-test-fails --format-hide-empty-pkg -- -race -count=1 "$@" ./...
