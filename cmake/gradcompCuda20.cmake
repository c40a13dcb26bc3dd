# Teaches CMake versions that lack it (3.25 and older) the cuda_std_20 compile
# feature for nvcc, so targets can require C++20 in CUDA translation units
# the CMake way. Include after the CUDA language is enabled; a no-op where
# CMake knows the feature already.
if(CMAKE_CUDA_COMPILER_LOADED AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
   AND NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
endif()
