# Install-time step (install(CODE) in CMakeLists.txt): copies the public headers into STAGE with
# their project includes rewritten from "base/macros.h" to "kiln/base/macros.h".
# Why: the source tree includes its headers by generic names, which is fine inside Kiln but not in a
# consumer's include path. The installed package exports only <prefix>/include, so a research repo
# with its own src/base/macros.h or src/models/resnet.h cannot replace Kiln's headers (an imported
# target's directories come as -isystem, searched after the consumer's -I). The source tree keeps
# its includes, so no compiled object goes stale.
# In: SRC (the source root), BUILD_INFO (the generated kiln_build_info.h), STAGE (the output folder,
# recreated), DIRS (folders installed whole), FILES (single headers, relative to SRC).
file(REMOVE_RECURSE "${STAGE}")
set(headers ${FILES})
foreach(dir ${DIRS})
  file(GLOB_RECURSE found RELATIVE "${SRC}" "${SRC}/${dir}/*.h" "${SRC}/${dir}/*.inc")
  list(APPEND headers ${found})
endforeach()
list(FILTER headers EXCLUDE REGEX "(^|/)internal\\.h$")  # private to the library
list(REMOVE_DUPLICATES headers)
# The top-level names a project include starts with: every folder that holds headers, and the
# generated build-info header.
set(project_include "((base|engine|kernels|models|io|runtime)/[^\"]+|kiln_build_info\\.h)")
foreach(rel ${headers} kiln_build_info.h)
  if(rel STREQUAL "kiln_build_info.h")
    set(from "${BUILD_INFO}")
  else()
    set(from "${SRC}/${rel}")
  endif()
  file(READ "${from}" text)
  string(REGEX REPLACE "#include[ \t]+\"${project_include}\"" "#include \"kiln/\\1\"" text "${text}")
  file(WRITE "${STAGE}/${rel}" "${text}")
endforeach()
