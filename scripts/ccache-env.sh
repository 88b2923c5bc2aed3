# Sourced by the build scripts. The compiler cache keys paths relative to the
# checkout, so a fresh clone in another folder hits the last build's cache.
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
# New build trees use Ninja (scripts/deps.sh installs it): it keeps both
# cores busy across the targets of one build, where make finishes one target
# before the next. A tree configured earlier keeps its generator.
if [ -z "${CMAKE_GENERATOR:-}" ] && command -v ninja > /dev/null; then export CMAKE_GENERATOR=Ninja; fi
