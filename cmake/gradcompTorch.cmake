# PyTorch, for the gradcomp::torch component (the c10d backend) and the
# Python module: found through the python3 that imports torch.

# The oldest PyTorch the component is built for: the oldest it has been
# built and tested with (its C++ uses c10d's and autograd's headers, whose
# interfaces move between versions).
set(GRADCOMP_TORCH_MINIMUM 2.14)

# Why the torch component is not built: a note, or, where the Python package
# is what was asked for (pip), an error that says what to do.
macro(gradcomp_torch_missing why)
  if(GRADCOMP_PYTHON_PACKAGE)
    message(FATAL_ERROR "gradcomp: ${why}. The Python package is built against the PyTorch already installed "
                        "(PyTorch ${GRADCOMP_TORCH_MINIMUM} or newer): install torch into this environment first, "
                        "then `pip install --no-build-isolation .` so the build sees it.")
  endif()
  message(STATUS "gradcomp: ${why}; the torch component is not built")
  return()
endmacro()

# PyTorch's CMake package resets CMAKE_CUDA_ARCHITECTURES and appends to the
# CUDA flags of whoever finds it; it is looked for inside a function, so those
# variables stay in the function's scope and gradcomp's own CUDA targets keep
# theirs. Its imported targets are the directory's, visible to every target.
function(gradcomp_find_torch)
  find_package(Python3 COMPONENTS Interpreter Development.Module)
  if(NOT Python3_FOUND)
    gradcomp_torch_missing("no Python 3 interpreter with its development headers")
  endif()
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    gradcomp_torch_missing("${Python3_EXECUTABLE} cannot import torch")
  endif()
  list(PREPEND CMAKE_PREFIX_PATH ${prefix})
  find_package(Torch QUIET)
  if(NOT Torch_FOUND)
    gradcomp_torch_missing("PyTorch's CMake package (in ${prefix}) was not usable")
  endif()
  if(Torch_VERSION VERSION_LESS GRADCOMP_TORCH_MINIMUM)
    gradcomp_torch_missing("PyTorch ${Torch_VERSION} is older than ${GRADCOMP_TORCH_MINIMUM}")
  endif()
  find_library(GRADCOMP_TORCH_PYTHON torch_python PATHS ${TORCH_INSTALL_PREFIX}/lib NO_DEFAULT_PATH REQUIRED)
  set(GRADCOMP_TORCH_PYTHON ${GRADCOMP_TORCH_PYTHON} PARENT_SCOPE)
  set(GRADCOMP_TORCH_VERSION ${Torch_VERSION} PARENT_SCOPE)
  # The PyPI wheel's CUDA libraries need the nvidia-* wheels' (a newer NCCL
  # than the system's, say): the linker of a program must find those.
  file(GLOB wheel_libs LIST_DIRECTORIES true ${TORCH_INSTALL_PREFIX}/../nvidia/*/lib ${TORCH_INSTALL_PREFIX}/../nvidia/cu*/lib)
  set(GRADCOMP_TORCH_LINK_DIRS ${wheel_libs} PARENT_SCOPE)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"
                  OUTPUT_VARIABLE suffix OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(GRADCOMP_PYTHON ${Python3_EXECUTABLE} PARENT_SCOPE)
  set(GRADCOMP_PYTHON_SUFFIX ${suffix} PARENT_SCOPE)
  set(GRADCOMP_TORCH ON PARENT_SCOPE)
  message(STATUS "gradcomp: PyTorch ${Torch_VERSION} found for ${Python3_EXECUTABLE}: building the torch component")
endfunction()

# A Python extension module `target` built from `sources`, linked with
# gradcomp::torch and PyTorch's Python bindings, written to `directory`.
function(gradcomp_add_python_module target name directory)
  add_library(${target} MODULE ${ARGN})
  target_link_libraries(${target} PRIVATE gradcomp::torch Python3::Module ${GRADCOMP_TORCH_PYTHON})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME ${name} PREFIX "" SUFFIX ${GRADCOMP_PYTHON_SUFFIX}
                                             LIBRARY_OUTPUT_DIRECTORY ${directory} CXX_VISIBILITY_PRESET hidden
                                             SKIP_BUILD_RPATH ON)  # `import torch` has loaded its libraries
endfunction()
