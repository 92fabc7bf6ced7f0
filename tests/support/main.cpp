// lanebus — MIT License.
// The one translation unit that defines doctest's main; test cases live in the executables.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
