# Ring attention tests: the MPI-free replay (GoogleTest, one process; forward
# and backward) and tileattn-ring under mpirun with 2 and 3 ranks on one
# machine (forward, and forward + backward with --backward). Only when
# src/mpi was built (MPI found and TILEATTN_BUILD_MPI on); otherwise one
# placeholder test says why, shows as skipped, and fails where
# TILEATTN_REQUIRE_ALL=1 (scripts/test.sh, CI: setup.sh installs Open MPI).
if(NOT TARGET tileattn_mpi)
  if(NOT TILEATTN_BUILD_MPI)
    set(mpi_missing "TILEATTN_BUILD_MPI is OFF")
  else()
    set(mpi_missing "CMake found no MPI (scripts/setup.sh installs libopenmpi-dev and openmpi-bin)")
  endif()
  add_test(NAME mpi.not_built
    COMMAND sh -c "echo \"ring attention (MPI) tests not built: $0\"; if [ \"$TILEATTN_REQUIRE_ALL\" = 1 ]; then echo 'FAIL: TILEATTN_REQUIRE_ALL=1 requires them'; exit 1; fi; exit 77"
            "${mpi_missing}")
  set_tests_properties(mpi.not_built PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 10)
  return()
endif()

add_executable(mpi_ring_block_tests ${CMAKE_CURRENT_LIST_DIR}/ring_block_tests.cpp)
target_include_directories(mpi_ring_block_tests PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(mpi_ring_block_tests PRIVATE tileattn_mpi tileattn_test_support GTest::gtest GTest::gtest_main)
# Prefixed so that `ctest -R mpi` runs them with the mpirun cases.
gtest_discover_tests(mpi_ring_block_tests TEST_PREFIX mpi. DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)

# Open MPI settings for a single machine, as environment so that another MPI
# ignores them: allow root (containers), more ranks than cores, no core
# binding, loopback TCP only.
set(TILEATTN_MPIRUN_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
  OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo)

function(tileattn_ring_test name ranks)
  add_test(NAME mpi_ring_${name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} $<TARGET_FILE:tileattn_ring>
            --threads 1 --check ${ARGN})
  set_tests_properties(mpi_ring_${name} PROPERTIES
    ENVIRONMENT "${TILEATTN_MPIRUN_ENV}" TIMEOUT 60 PROCESSORS ${ranks}
    FAIL_REGULAR_EXPRESSION "FAIL")
endfunction()

tileattn_ring_test(np2_full 2 --seq 500 --heads 4 --kv-heads 4 --dim 64)
tileattn_ring_test(np2_causal_gqa 2 --seq 777 --heads 4 --kv-heads 2 --dim 64 --causal)
tileattn_ring_test(np3_causal_gqa 3 --seq 1000 --heads 8 --kv-heads 2 --dim 64 --causal)
tileattn_ring_test(np3_full_mqa 3 --seq 600 --heads 4 --kv-heads 1 --dim 80 --batch 2)
tileattn_ring_test(np3_window_contiguous 3 --seq 500 --heads 2 --dim 96 --window 64,0 --layout contiguous)
tileattn_ring_test(np3_fewer_rows_than_chunks 3 --seq 4 --heads 2 --dim 32 --causal)
tileattn_ring_test(np2_causal_fp16 2 --seq 300 --heads 2 --kv-heads 1 --dim 128 --causal --dtype fp16)
# 16-bit storage: O rounded once, after the fp32 merges (these two failed the
# rule while each piece's partial O was rounded to 16 bits first).
tileattn_ring_test(np1_bf16_d128_seed6 1 --seq 64 --heads 2 --dim 128 --dtype bf16 --seed 6)
tileattn_ring_test(np3_fp16_d32_seed3 3 --seq 300 --heads 2 --dim 32 --dtype fp16 --seed 3)
set_tests_properties(mpi_ring_np1_bf16_d128_seed6 mpi_ring_np3_fp16_d32_seed3 PROPERTIES
  PASS_REGULAR_EXPRESSION "\nPASS")

# Backward (--backward): the forward's checks plus dQ, dK, dV against the
# float64 reference; "backward PASS" must be printed, so a run that skipped
# the backward cannot pass.
function(tileattn_ring_backward_test name ranks)
  tileattn_ring_test(${name} ${ranks} --backward ${ARGN})
  set_tests_properties(mpi_ring_${name} PROPERTIES PASS_REGULAR_EXPRESSION "backward PASS")
endfunction()

tileattn_ring_backward_test(np2_backward_full 2 --seq 500 --heads 4 --kv-heads 4 --dim 64)
tileattn_ring_backward_test(np2_backward_causal_gqa 2 --seq 600 --heads 4 --kv-heads 2 --dim 64 --causal)
tileattn_ring_backward_test(np3_backward_causal_gqa 3 --seq 700 --heads 6 --kv-heads 2 --dim 64 --causal)
tileattn_ring_backward_test(np3_backward_full_mqa 3 --seq 400 --heads 4 --kv-heads 1 --dim 80 --batch 2)
tileattn_ring_backward_test(np2_backward_causal_fp16 2 --seq 300 --heads 2 --kv-heads 1 --dim 128 --causal --dtype fp16)
tileattn_ring_backward_test(np3_backward_causal_bf16 3 --seq 300 --heads 2 --kv-heads 1 --dim 96 --causal --dtype bf16)
tileattn_ring_backward_test(np3_backward_window_contiguous 3 --seq 500 --heads 2 --dim 96 --window 64,0 --layout contiguous)
tileattn_ring_backward_test(np3_backward_rank_without_rows 3 --seq 2 --heads 2 --dim 32 --causal)
# The float64 reference path (TILEATTN_ISA=reference): its block backward takes
# P from the global LSE the ring gives it.
tileattn_ring_backward_test(np3_backward_reference_isa 3 --seq 60 --heads 2 --kv-heads 1 --dim 16 --causal)
set_tests_properties(mpi_ring_np3_backward_reference_isa PROPERTIES
  ENVIRONMENT "${TILEATTN_MPIRUN_ENV};TILEATTN_ISA=reference")

# Bad input: one line on stderr naming the argument, exit status 2 from every rank.
add_test(NAME mpi_ring_bad_argument
  COMMAND sh -c "\"$0\" -n 2 \"$1\" --seq 0 --heads 2 --dim 64 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
set_tests_properties(mpi_ring_bad_argument PROPERTIES
  ENVIRONMENT "${TILEATTN_MPIRUN_ENV}" TIMEOUT 60 PASS_REGULAR_EXPRESSION "error: --seq must be >= 1[^\n]*\n(.|\n)*exit status 2")

# Sizes: refused before anything is allocated, one line naming the flags and
# exit status 2 (it crashed with std::length_error / bad_alloc, SIGABRT); a
# size under the limit that does not fit in memory (here: under a 3 GB
# address-space limit) says "out of memory", exit status 2.
add_test(NAME mpi_ring_too_large_batch
  COMMAND sh -c "\"$0\" -n 2 \"$1\" --batch 4000000000000000000 --seq 2 --heads 2 --dim 8 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
add_test(NAME mpi_ring_too_large_shape
  COMMAND sh -c "\"$0\" -n 2 \"$1\" --seq 100000 --heads 100000 --dim 256 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
add_test(NAME mpi_ring_out_of_memory
  COMMAND sh -c "ulimit -v 3000000; \"$0\" -n 2 \"$1\" --seq 1048576 --heads 16 --dim 64 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
set_tests_properties(mpi_ring_too_large_batch PROPERTIES
  PASS_REGULAR_EXPRESSION "error: --batch 4000000000000000000 [^\n]*too large[^\n]*\n(.|\n)*exit status 2")
set_tests_properties(mpi_ring_too_large_shape PROPERTIES
  PASS_REGULAR_EXPRESSION "error: [^\n]*--seq 100000 --dim 256: too large[^\n]*\n(.|\n)*exit status 2")
set_tests_properties(mpi_ring_out_of_memory PROPERTIES
  PASS_REGULAR_EXPRESSION "tileattn-ring: out of memory\n(.|\n)*exit status 2")
set_tests_properties(mpi_ring_too_large_batch mpi_ring_too_large_shape mpi_ring_out_of_memory PROPERTIES
  ENVIRONMENT "${TILEATTN_MPIRUN_ENV}" TIMEOUT 60
  FAIL_REGULAR_EXPRESSION "terminate called|length_error|std::bad_alloc|received signal|Aborted")

# --threads is bounded before its cast to int.
add_test(NAME mpi_ring_threads_out_of_range
  COMMAND sh -c "\"$0\" -n 2 \"$1\" --seq 8 --heads 2 --dim 32 --threads 5000000000 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
set_tests_properties(mpi_ring_threads_out_of_range PROPERTIES
  PASS_REGULAR_EXPRESSION "error: --threads must be in 0..4096, got 5000000000\n(.|\n)*exit status 2")

# An MPMD launch can give ranks different flags: the ranks compare what they
# parsed before running (a rank with --check would wait for ever on one
# without), and a flag only one rank finds bad, or --help on one rank only, stops all.
add_test(NAME mpi_ring_mpmd_check_on_one_rank
  COMMAND sh -c "\"$0\" -n 1 \"$1\" --seq 8 --heads 2 --dim 32 --check : -n 1 \"$1\" --seq 8 --heads 2 --dim 32 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
set_tests_properties(mpi_ring_mpmd_check_on_one_rank PROPERTIES
  PASS_REGULAR_EXPRESSION "error: the ranks were given different flags: --check differs\n(.|\n)*exit status 2")
add_test(NAME mpi_ring_mpmd_bad_flag_on_one_rank
  COMMAND sh -c "\"$0\" -n 1 \"$1\" --seq 8 --heads 2 --dim 32 : -n 1 \"$1\" --seq 0 --heads 2 --dim 32 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
set_tests_properties(mpi_ring_mpmd_bad_flag_on_one_rank PROPERTIES
  PASS_REGULAR_EXPRESSION "error: rank 1: --seq must be >= 1, got 0\n(.|\n)*exit status 2")
add_test(NAME mpi_ring_mpmd_help_on_one_rank
  COMMAND sh -c "\"$0\" -n 1 \"$1\" --help : -n 1 \"$1\" --seq 8 --heads 2 --dim 32 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
set_tests_properties(mpi_ring_mpmd_help_on_one_rank PROPERTIES
  PASS_REGULAR_EXPRESSION "error: the ranks were given different flags: --help differs\n(.|\n)*exit status 2")

# A failure every rank shares (here a bad TILEATTN_ISA on all three) is
# printed once, by rank 0, not once per rank.
add_test(NAME mpi_ring_error_printed_once
  COMMAND sh -c "\"$0\" -n 3 \"$1\" --seq 8 --heads 2 --dim 32 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
set_tests_properties(mpi_ring_error_printed_once PROPERTIES
  PASS_REGULAR_EXPRESSION "tileattn-ring: error: [^\n]*'bogus'\n(.|\n)*exit status 2"
  FAIL_REGULAR_EXPRESSION "error:[^\n]*\n(.|\n)*error:")
set_tests_properties(mpi_ring_threads_out_of_range mpi_ring_mpmd_check_on_one_rank mpi_ring_mpmd_bad_flag_on_one_rank
                     mpi_ring_mpmd_help_on_one_rank PROPERTIES ENVIRONMENT "${TILEATTN_MPIRUN_ENV}" TIMEOUT 60)
set_tests_properties(mpi_ring_error_printed_once PROPERTIES
  ENVIRONMENT "${TILEATTN_MPIRUN_ENV};TILEATTN_ISA=bogus" TIMEOUT 60)

# --help: the usage on stdout and exit status 0, as `tileattn --help`.
add_test(NAME mpi_ring_help
  COMMAND sh -c "\"$0\" -n 2 \"$1\" --help; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
set_tests_properties(mpi_ring_help PROPERTIES
  ENVIRONMENT "${TILEATTN_MPIRUN_ENV}" TIMEOUT 60 PASS_REGULAR_EXPRESSION "usage: mpirun(.|\n)*exit status 0"
  FAIL_REGULAR_EXPRESSION "error")

# A flag given twice is an error naming it (as for `tileattn`), not "last wins".
add_test(NAME mpi_ring_repeated_flag
  COMMAND sh -c "\"$0\" -n 2 \"$1\" --seq 8 --heads 2 --dim 32 --seq 16 2>&1; echo exit status $?"
          ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:tileattn_ring>)
set_tests_properties(mpi_ring_repeated_flag PROPERTIES
  ENVIRONMENT "${TILEATTN_MPIRUN_ENV}" TIMEOUT 60
  PASS_REGULAR_EXPRESSION "error: --seq: given more than once[^\n]*\n(.|\n)*exit status 2")

# The C++ API's collective rules under mpirun -np 3 (tests/mpi/ring_api_tests.cpp):
# one rank's bad arguments, unavailable path or disagreeing options make every
# rank throw the same kind, none hangs (TIMEOUT), nothing is written.
add_executable(mpi_ring_api_tests ${CMAKE_CURRENT_LIST_DIR}/ring_api_tests.cpp)
target_include_directories(mpi_ring_api_tests PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(mpi_ring_api_tests PRIVATE tileattn_mpi)
foreach(api_case good_arguments good_backward isa_unavailable_on_one_rank backward_isa_unavailable_on_one_rank
        isa_env_bad_on_one_rank isa_out_of_enum_on_one_rank out_of_memory_on_one_rank other_exception_on_one_rank
        v_head_dim_on_one_rank v_head_dim_everywhere backward_v_head_dim_everywhere v_head_dim_equal_to_head_dim
        scale_disagrees backward_scale_disagrees isa_disagrees window_disagrees default_scale_given_explicitly)
  add_test(NAME mpi_ring_api_${api_case}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 $<TARGET_FILE:mpi_ring_api_tests> ${api_case})
  set_tests_properties(mpi_ring_api_${api_case} PROPERTIES
    ENVIRONMENT "${TILEATTN_MPIRUN_ENV}" TIMEOUT 30 PROCESSORS 3 SKIP_RETURN_CODE 77
    PASS_REGULAR_EXPRESSION "\nPASS\n" FAIL_REGULAR_EXPRESSION "FAIL|UNEXPECTED")
endforeach()
