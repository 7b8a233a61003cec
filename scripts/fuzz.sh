#!/usr/bin/env bash
# Runs every fuzz target of the repository for a short budget each
# (FUZZTIME, default 20000x: twenty thousand executions), one after the
# other, and stops at the first failure: a crash found, a hang, or a seed
# that no longer passes. The failing input is written by `go test` to the
# package's testdata/fuzz/<FuzzName>/ directory, where it becomes a
# regression seed.
#
# The default budget is a count of executions, not a duration. With a
# duration, Go's fuzz coordinator can report a spurious "context deadline
# exceeded" failure, with no failing input, when a starved worker has not
# answered by the deadline (golang/go#75804, fixed only in Go 1.27); a
# count has no deadline to race. On a 2-core machine 20000 executions take
# from 2 s (FuzzParseProject) to about 25 s (FuzzValidateChat).
#
#   scripts/fuzz.sh                 every target, 20000 executions each
#   FUZZTIME=200000x scripts/fuzz.sh  a larger budget (a duration such as
#                                   1m works too, with the race above)
#   scripts/fuzz.sh Project         only targets whose name matches
set -euo pipefail

cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-20000x}"
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
