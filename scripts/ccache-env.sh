# Sourced by the build scripts. The compiler cache keys paths relative to the
# checkout, so a fresh clone in another folder hits the last build's cache.
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
# Depend mode: on a miss ccache takes the header list from the compiler's
# own -MD output instead of running the preprocessor a second time to hash
# its output (the SDK's objects from an empty cache: 92-99 CPU-seconds
# against 107-114 without it, measured twice each, alternating). Hits in a
# clone in another folder still work (base_dir).
export CCACHE_DEPEND=1
# New build trees use Ninja (scripts/deps.sh installs it): it keeps both
# cores busy across the targets of one build, where make finishes one target
# before the next. A tree configured earlier keeps its generator.
if [ -z "${CMAKE_GENERATOR:-}" ] && command -v ninja > /dev/null; then export CMAKE_GENERATOR=Ninja; fi
# The flags of ./build, one definition for scripts/build.sh (and so
# run.sh) and scripts/test.sh, so neither rebuilds what the other built:
# RelWithDebInfo with line tables only (-g1): backtraces and perf still name
# functions, files and lines; full debug info (-g) costs a fifth more
# compile time (ws_stream_tls.cpp: 95 s against 75 s) for variables in a
# debugger, which -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g -DNDEBUG" gives back.
im_build_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
# Link with lld (Debian's `lld`, installed by scripts/deps.sh) where it is
# present: relinking every binary of a warm tree took 34 CPU-s with GNU ld
# against 12 with lld (./build, 49 links), 66 against 28 (the ASan tree)
# and 40 against 13 (the TSan tree); on a faster machine 13.8 against 3.6
# (./build). Links are a part of a warm build the compiler cache cannot
# serve (moc is another); over a whole warm test.sh run the gain is within
# the noise (README, Timings). Without lld, the system's default linker.
im_link_flags=()
if command -v ld.lld > /dev/null; then
    for kind in EXE SHARED MODULE; do im_link_flags+=("-DCMAKE_${kind}_LINKER_FLAGS=-fuse-ld=lld"); done
fi
im_build_flags+=("${im_link_flags[@]}")
