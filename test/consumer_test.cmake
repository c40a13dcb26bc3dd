# Installs gradcomp from BUILD_DIR into a fresh prefix, then configures,
# builds and runs examples/find_package against it, as an outside project.
file(REMOVE_RECURSE ${WORK_DIR})
string(REPLACE "," ";" COMPONENTS "${COMPONENTS}")
set(prefix ${WORK_DIR}/prefix)

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "consumer test step failed (${status}): ${ARGN}")
  endif()
endfunction()

run_step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run_step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/find_package -B ${WORK_DIR}/build -G ${GENERATOR}
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
         "-DGRADCOMP_COMPONENTS=${COMPONENTS}")
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step(${WORK_DIR}/build/consumer)

# A CPU-only consumer of the same installation, on a machine without the CUDA
# toolkit: asking for no component (or only mpi) must neither look for it
# nor fail without it.
set(cpu_components ${COMPONENTS})
list(REMOVE_ITEM cpu_components cuda nccl)
run_step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/find_package -B ${WORK_DIR}/build-cpu -G ${GENERATOR}
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
         -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON "-DGRADCOMP_COMPONENTS=${cpu_components}")
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build-cpu)
run_step(${WORK_DIR}/build-cpu/consumer)
