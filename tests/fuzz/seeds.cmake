# Writes one seed file per raw string literal R"(...)" found in the codec
# table sources (the frames of tests/server/codec_test.cpp and
# tests/sdk/tst_codec.cpp), so the fuzz corpora grow with the tables.
#   cmake -DSOURCES=a.cpp;b.cpp -DOUT=dir -P seeds.cmake
file(MAKE_DIRECTORY ${OUT})
set(n 0)
foreach(src ${SOURCES})
  file(READ ${src} text)
  string(REGEX MATCHALL "R\"\\(([^)]*)\\)\"" literals "${text}")
  foreach(lit ${literals})
    string(REGEX REPLACE "^R\"\\((.*)\\)\"$" "\\1" frame "${lit}")
    math(EXPR n "${n} + 1")
    file(WRITE ${OUT}/seed-${n} "${frame}")
  endforeach()
endforeach()
message(STATUS "${n} seeds in ${OUT}")
