# Include hygiene: each module's headers are reachable only by the targets that
# link the module with its usage requirements.
#
# Sources include internal headers by their path from the repository root
# ("emu/qp/qp_state.hpp", "core/provider.hpp"). The root itself is never an
# include directory of a product target: instead each module gets a directory of
# its own under the build tree holding a single link named after the module, and
# that directory is a PUBLIC include directory of the module's target. A target
# that links the module (directly or through another module's PUBLIC link) sees
# its headers; one that links it with $<LINK_ONLY:...> (the ABI layer links the
# backends that way) gets its code and not its headers, and an #include of them
# fails to compile. tests/layout/ checks the same rules on the sources.

# sv_module_headers(<target> <folder>): <folder> (relative to the source root,
# e.g. "emu" or "abi/common") is included as "<folder>/..." by users of <target>.
function(sv_module_headers target folder)
  string(REPLACE "/" "_" tag "${folder}")
  set(root ${CMAKE_BINARY_DIR}/include-roots/${tag})
  get_filename_component(parent ${root}/${folder} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  if(NOT EXISTS ${root}/${folder})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${folder} ${root}/${folder} SYMBOLIC)
  endif()
  target_include_directories(${target} PUBLIC ${root})
endfunction()
