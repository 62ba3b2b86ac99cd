# What `cmake --install BUILD --prefix P` installs, and the Debian package
# (`cpack -G DEB` in the build tree). docs/install.md is the user's side.
#
#   P/lib/softverbs/libibverbs.so.1   the drop-in libraries, in a private directory:
#   P/lib/softverbs/librdmacm.so.1    never on the default loader path, so they
#                                     cannot shadow the system's rdma-core
#                                     (librdmacm.so.1 finds libibverbs.so.1
#                                     beside it: run path $ORIGIN)
#   P/lib/softverbs/librspreload.so   TCP sockets over rsockets by LD_PRELOAD
#                                     (`softverbs run --rsockets`)
#   P/bin/softverbs                   the softverbs command (finds the library relative to itself;
#                                     installed by tools/CMakeLists.txt)
#   P/include/softverbs/              the control API headers (faults.h, faults.hpp) and
#                                     the GoogleTest kit (testing.hpp)
#   P/lib/cmake/softverbs/            find_package(softverbs CONFIG) and softverbs_add_test()
#   P/lib/pkgconfig/softverbs.pc      pkg-config
#
# Every installed path is relative to the prefix, so an installed tree can be moved.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SV_INSTALL_PRIVATE_LIBDIR ${CMAKE_INSTALL_LIBDIR}/softverbs)
set(SV_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/softverbs)
set(SV_INSTALL_PKGCONFIGDIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(TARGETS ibverbs rdmacm LIBRARY DESTINATION ${SV_INSTALL_PRIVATE_LIBDIR} NAMELINK_SKIP)
install(TARGETS rspreload LIBRARY DESTINATION ${SV_INSTALL_PRIVATE_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/softverbs/faults.h ${CMAKE_SOURCE_DIR}/include/softverbs/faults.hpp
              ${CMAKE_SOURCE_DIR}/include/softverbs/testing.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/softverbs)

# CMake package.
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/softverbsConfig.cmake.in
  ${CMAKE_BINARY_DIR}/package/softverbsConfig.cmake
  INSTALL_DESTINATION ${SV_INSTALL_CMAKEDIR}
  PATH_VARS CMAKE_INSTALL_BINDIR CMAKE_INSTALL_INCLUDEDIR SV_INSTALL_PRIVATE_LIBDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/package/softverbsConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/package/softverbsConfig.cmake
              ${CMAKE_BINARY_DIR}/package/softverbsConfigVersion.cmake
        DESTINATION ${SV_INSTALL_CMAKEDIR})

# pkg-config: paths relative to the .pc file's own directory (${pcfiledir}).
file(RELATIVE_PATH SV_PC_PREFIX_FROM_PCDIR /prefix/${SV_INSTALL_PKGCONFIGDIR} /prefix)
configure_file(${CMAKE_SOURCE_DIR}/cmake/softverbs.pc.in ${CMAKE_BINARY_DIR}/package/softverbs.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/package/softverbs.pc DESTINATION ${SV_INSTALL_PKGCONFIGDIR})

# The Debian package: everything above under /usr. Its files live in
# /usr/lib/softverbs (libibverbs.so.1, librdmacm.so.1), /usr/bin/softverbs, /usr/include/softverbs,
# /usr/lib/cmake/softverbs and /usr/lib/pkgconfig/softverbs.pc, none of which
# rdma-core's packages own, so it installs beside them.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME softverbs)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "RDMA verbs in software: drop-in libibverbs.so.1 and librdmacm.so.1 with emulated RoCEv2/InfiniBand devices")
set(CPACK_PACKAGE_CONTACT "softverbs maintainers <softverbs@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
# The library links the C++ runtime statically: at run time it needs the C
# library and ISA-L only. So does the softverbs command (tools/CMakeLists.txt),
# which needs the C library only.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6 (>= 2.36), libisal2")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "ibverbs-utils, perftest")
include(CPack)
