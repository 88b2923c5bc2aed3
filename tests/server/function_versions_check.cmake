# server_function_versions_check: the build refuses function files that are
# not the newest version of schema/functions/versions.txt, and accepts them
# with the lines its error prints. Runs embed_schema.cmake on copies of
# schema/ in WORK. Inputs: SCHEMA_DIR, WORK, EMBED.
function(embed dir expect_ok out_var)
  execute_process(COMMAND ${CMAKE_COMMAND} -DSCHEMA_DIR=${dir} -DOUT=${WORK}/out.cpp -P ${EMBED}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "embedding ${dir} failed:\n${err}")
  elseif(NOT expect_ok AND rc EQUAL 0)
    message(FATAL_ERROR "embedding ${dir} succeeded, but its function files are not versions.txt's newest version")
  endif()
  set(${out_var} "${err}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(COPY ${SCHEMA_DIR} DESTINATION ${WORK})
set(dir ${WORK}/schema)

# The tree as it is.
embed(${dir} ON ignored)

# im_send.sql changed, versions.txt not: refused, naming the next version.
file(STRINGS ${dir}/functions/versions.txt lines REGEX "^[0-9]+ ")
list(GET lines -1 last)
string(REGEX MATCH "^[0-9]+" top "${last}")
math(EXPR next "${top} + 1")
file(APPEND ${dir}/functions/im_send.sql "-- changed\n")
embed(${dir} OFF err)
string(FIND "${err}" "append these lines" at)
if(at LESS 0)
  message(FATAL_ERROR "the refusal does not say what to do:\n${err}")
endif()

# With the printed lines appended: accepted, as version `next`.
string(REGEX MATCHALL "\n *${next} [A-Za-z0-9_]+ [0-9a-f]+" wanted "${err}")
list(LENGTH wanted n)
if(n EQUAL 0)
  message(FATAL_ERROR "the refusal prints no lines for version ${next}:\n${err}")
endif()
foreach(w IN LISTS wanted)
  string(STRIP "${w}" w)
  file(APPEND ${dir}/functions/versions.txt "${w}\n")
endforeach()
embed(${dir} ON ignored)
file(READ ${WORK}/out.cpp generated)
string(FIND "${generated}" "{${next}, \"im_send\"," at)
if(at LESS 0)
  message(FATAL_ERROR "the generated source does not record version ${next} of im_send")
endif()

# A version number skipped, or a bad line: refused.
file(APPEND ${dir}/functions/versions.txt "${next}5 im_send 0000000000000000000000000000000000000000000000000000000000000000\n")
embed(${dir} OFF ignored)
message(STATUS "function set versions: checked")
