# Read by ctest after the discovered tests (tests/faults/CMakeLists.txt): the
# fault tests registered on virtual time get the labels faults and virtual.
foreach(t IN LISTS sv_virtual_fault_tests sv_virtual_cm_tests sv_virtual_replay_tests)
  set_tests_properties(${t} PROPERTIES LABELS "faults;virtual")
endforeach()
