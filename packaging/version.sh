#!/bin/sh
# Print Chorus's release version, read from its one source, and fail (exit 1, saying where) if a
# place that must agree with it does not:
#   the source       __version__ in coordinator/chorus/__init__.py (MAJOR.MINOR.PATCH)
#   pyproject.toml   takes it from there (dynamic = ["version"]), states none of its own
#   the extension    default_version in extension/chorus.control is the release's MAJOR.MINOR
#                    (PostgreSQL wants it literal there; a patch release changes no SQL), and
#                    sql/chorus--<that>.sql exists
# The Debian packages (packaging/build-debs.sh) are versioned by what this prints.
# Usage: packaging/version.sh [TREE]   (TREE: the repository's root; default: this script's)
set -eu
tree=${1:-$(dirname "$0")/..}
fail() { echo "version: $*" >&2; exit 1; }

version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$tree/coordinator/chorus/__init__.py")
echo "$version" | grep -Eqx '[0-9]+\.[0-9]+\.[0-9]+' \
  || fail "no __version__ = \"MAJOR.MINOR.PATCH\" line in coordinator/chorus/__init__.py (found '$version')"

grep -Eq '^dynamic = \[.*"version".*\]' "$tree/pyproject.toml" \
  && grep -Fq 'version = {attr = "chorus.__version__"}' "$tree/pyproject.toml" \
  || fail "pyproject.toml must take its version from chorus.__version__ (dynamic = [\"version\"])"
project_version=$(awk '/^\[/ { in_project = ($0 == "[project]") } in_project && /^version *=/' "$tree/pyproject.toml")
[ -z "$project_version" ] \
  || fail "pyproject.toml states a version of its own; the version is chorus.__version__ ($version)"

sql_version=$(sed -n "s/^default_version = '\(.*\)'$/\1/p" "$tree/extension/chorus.control")
[ "$sql_version" = "${version%.*}" ] \
  || fail "extension/chorus.control has default_version '$sql_version'; release $version needs '${version%.*}'"
[ -f "$tree/sql/chorus--$sql_version.sql" ] || fail "sql/chorus--$sql_version.sql is missing"

echo "$version"
