#!/usr/bin/env bash
# isa_launcher's check, on any CPU: forced "absent", the AVX-512 test binary
# is skipped (77) without starting; forced "present" on a CPU that lacks
# AVX-512, it dies of SIGILL as it did before the launcher (so the check is
# what prevents the crash); a bad override is refused.
set -u
launcher=$1 binary=$2
fail() { echo "isa_launcher_test: $*" >&2; exit 1; }

out=$(GRADCOMP_TEST_ISA=absent "$launcher" 4 "$binary")
rc=$?
[ "$rc" -eq 77 ] || fail "forced absent: exit $rc, expected 77 (skipped)"
grep -q skipped <<<"$out" || fail "forced absent: no 'skipped' in: $out"

GRADCOMP_TEST_ISA=sometimes "$launcher" 4 "$binary" >/dev/null 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "a bad GRADCOMP_TEST_ISA: exit $rc, expected 2"

"$launcher" --probe
if "$launcher" --probe | grep -q 'v4 (AVX-512): no'; then
  GRADCOMP_TEST_ISA=present "$launcher" 4 "$binary" --test-case='16-bit*' >/dev/null 2>&1
  rc=$?
  [ "$rc" -eq $((128 + 4)) ] || fail "forced present without AVX-512: exit $rc, expected SIGILL (132)"
  echo "forced present on a CPU without AVX-512: SIGILL, as without the launcher"
else
  echo "this CPU has AVX-512: isa_v4 runs the binary in full; the SIGILL check needs a CPU without it"
fi
echo "isa_launcher_test: passed"
