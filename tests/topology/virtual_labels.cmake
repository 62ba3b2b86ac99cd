# Read by ctest after the discovered tests (tests/topology/CMakeLists.txt): the
# topology tests registered on virtual time get the labels faults and virtual.
foreach(t IN LISTS sv_virtual_topology_tests)
  set_tests_properties(${t} PROPERTIES LABELS "faults;virtual")
endforeach()
