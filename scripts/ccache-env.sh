# Sourced by the build scripts: the compiler cache keys paths relative to the
# checkout, so a fresh clone in another folder hits the last build's cache.
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
