#!/usr/bin/env bash
# Runs every fuzz target of the repository for a short budget each
# (FUZZTIME, default 10s), one after the other, and stops at the first
# failure: a crash found, a hang, or a seed that no longer passes. The
# failing input is written by `go test` to the package's
# testdata/fuzz/<FuzzName>/ directory, where it becomes a regression seed.
#
#   scripts/fuzz.sh              every target, 10 s each
#   FUZZTIME=1m scripts/fuzz.sh  a longer budget
#   scripts/fuzz.sh Project      only targets whose name matches
set -euo pipefail

cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-10s}"
filter="${1:-}"

# file:function pairs, found the way the brief says: every _test.go file
# holding a `func Fuzz...`, then the targets it declares.
mapfile -t files < <(grep -rl --include='*_test.go' --exclude-dir=testdata --exclude-dir=vendor --exclude-dir=.git 'func Fuzz' . | sort)
if [ "${#files[@]}" -eq 0 ]; then
	echo "fuzz.sh: no fuzz targets found" >&2
	exit 1
fi

ran=()
for file in "${files[@]}"; do
	dir="$(dirname "$file")"
	while read -r name; do
		[ -n "$name" ] || continue
		if [ -n "$filter" ] && [[ "$name" != *"$filter"* ]]; then
			continue
		fi
		echo "=== fuzz $dir $name ($fuzztime)"
		if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$dir"; then
			echo "fuzz.sh: $dir $name FAILED; the failing input is under $dir/testdata/fuzz/$name/" >&2
			echo "fuzz.sh: ran before the failure: ${ran[*]:-none}" >&2
			exit 1
		fi
		ran+=("$dir:$name")
	done < <(grep -oE '^func Fuzz[A-Za-z0-9_]*\(' "$file" | sed -e 's/^func //' -e 's/($//')
done

if [ "${#ran[@]}" -eq 0 ]; then
	echo "fuzz.sh: no fuzz target matches \"$filter\"" >&2
	exit 1
fi
echo "fuzz.sh: ${#ran[@]} targets passed, $fuzztime each:"
printf '  %s\n' "${ran[@]}"
