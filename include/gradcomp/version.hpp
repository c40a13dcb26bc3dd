// gradcomp's version: the one place it is written. CMake reads the three
// numbers from here (project(VERSION) in the top-level CMakeLists.txt), so a
// copy of include/ compiles with nothing generated.
#pragma once

#define GRADCOMP_VERSION_MAJOR 0
#define GRADCOMP_VERSION_MINOR 3
#define GRADCOMP_VERSION_PATCH 0
/// MAJOR * 10000 + MINOR * 100 + PATCH.
#define GRADCOMP_VERSION (GRADCOMP_VERSION_MAJOR * 10000 + GRADCOMP_VERSION_MINOR * 100 + GRADCOMP_VERSION_PATCH)

#define GRADCOMP_VERSION_STR_(x) #x
#define GRADCOMP_VERSION_STR(x) GRADCOMP_VERSION_STR_(x)
/// "MAJOR.MINOR.PATCH".
#define GRADCOMP_VERSION_STRING                \
  GRADCOMP_VERSION_STR(GRADCOMP_VERSION_MAJOR) \
  "." GRADCOMP_VERSION_STR(GRADCOMP_VERSION_MINOR) "." GRADCOMP_VERSION_STR(GRADCOMP_VERSION_PATCH)

#define GRADCOMP_VERSION_TAG_(major, minor, patch) v##major##_##minor##_##patch
#define GRADCOMP_VERSION_TAG_EXPAND_(major, minor, patch) GRADCOMP_VERSION_TAG_(major, minor, patch)
/// The version as part of an identifier (the ABI namespace's name), e.g. v0_3_0.
#define GRADCOMP_VERSION_TAG \
  GRADCOMP_VERSION_TAG_EXPAND_(GRADCOMP_VERSION_MAJOR, GRADCOMP_VERSION_MINOR, GRADCOMP_VERSION_PATCH)
