// Runs an ISA test binary only on a CPU that has its instruction set, and
// reports the test skipped (77) elsewhere. It is built for the baseline ISA:
// the test binary is built whole for x86-64-v3 or -v4, so its static
// initializers (doctest's registration among them) already use that ISA and
// die of SIGILL before its own main could check anything.
//
//   isa_launcher LEVEL BINARY [ARGS...]   LEVEL: 3 (AVX2, F16C, FMA) or 4 (AVX-512)
//   isa_launcher --probe                  prints what this CPU has
//
// GRADCOMP_TEST_ISA=absent or =present overrides the check (to test the
// launcher itself: "present" on a CPU without the ISA must crash as the
// binary alone would, which shows the check is what prevents the crash).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace {

struct cpu_isa {
  bool v3 = false;  // AVX, AVX2, F16C, FMA, BMI1/2, LZCNT, MOVBE, and the OS saves YMM
  bool v4 = false;  // v3 and AVX-512 F, BW, CD, DQ, VL, and the OS saves ZMM
};

cpu_isa probe() {
  cpu_isa isa;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return isa;
  bool const fma = c >> 12 & 1u, movbe = c >> 22 & 1u, osxsave = c >> 27 & 1u, avx = c >> 28 & 1u, f16c = c >> 29 & 1u;
  if (!osxsave || !avx) return isa;
  unsigned xcr0_low = 0, xcr0_high = 0;  // which register states the OS saves (XGETBV 0)
  __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  bool const ymm_saved = (xcr0_low & 0x6u) == 0x6u;    // SSE and AVX state
  bool const zmm_saved = (xcr0_low & 0xe6u) == 0xe6u;  // and opmask, ZMM0-15 high halves, ZMM16-31
  bool const lzcnt = __get_cpuid(0x80000001u, &a, &b, &c, &d) && (c >> 5 & 1u);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return isa;
  bool const bmi1 = b >> 3 & 1u, avx2 = b >> 5 & 1u, bmi2 = b >> 8 & 1u;
  unsigned const avx512 = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);  // F, DQ, CD, BW, VL
  isa.v3 = ymm_saved && avx2 && f16c && fma && bmi1 && bmi2 && lzcnt && movbe;
  isa.v4 = isa.v3 && zmm_saved && (b & avx512) == avx512;
#endif
  return isa;
}

}  // namespace

int main(int argc, char** argv) {
  cpu_isa const isa = probe();
  if (argc == 2 && std::strcmp(argv[1], "--probe") == 0) {
    std::printf("x86-64-v3 (AVX2, F16C, FMA): %s\nx86-64-v4 (AVX-512): %s\n", isa.v3 ? "yes" : "no",
                isa.v4 ? "yes" : "no");
    return 0;
  }
  if (argc < 3 || (std::strcmp(argv[1], "3") != 0 && std::strcmp(argv[1], "4") != 0)) {
    std::fprintf(stderr, "usage: %s 3|4 BINARY [ARGS...]  or  %s --probe\n", argv[0], argv[0]);
    return 2;
  }
  char const level = argv[1][0];
  bool has = level == '3' ? isa.v3 : isa.v4;
  char const* forced = std::getenv("GRADCOMP_TEST_ISA");
  if (forced != nullptr && *forced != '\0') {
    std::string_view const f = forced;
    if (f != "absent" && f != "present") {
      std::fprintf(stderr, "isa_launcher: GRADCOMP_TEST_ISA is '%s'; expected absent or present\n", forced);
      return 2;
    }
    has = f == "present";
    std::printf("isa_launcher: GRADCOMP_TEST_ISA=%s overrides the CPU check\n", forced);
  }
  if (!has) {
    std::printf("isa_launcher: this CPU lacks x86-64-v%c: skipped\n", level);
    return 77;
  }
  std::fflush(stdout);
  execv(argv[2], argv + 2);
  std::fprintf(stderr, "isa_launcher: cannot run %s: %s\n", argv[2], std::strerror(errno));
  return 2;
}
