#!/usr/bin/env bash
# scripts/install-deps.sh with fake apt-get, dpkg-query, sudo and id on a PATH
# that holds nothing else, for the four machines a user starts from:
#   root, nothing installed         apt-get runs directly (no sudo)
#   a user with sudo                apt-get runs through sudo, DEBIAN_FRONTEND kept
#   a user without sudo             one clear line, non-zero exit, no apt-get
#   everything already installed    no apt-get, no sudo at all
# Each fake appends what it was asked to a log, which the cases then read.
set -uo pipefail
script="$(cd "$(dirname "$0")/../.." && pwd)/scripts/install-deps.sh"
bash_bin="$(command -v bash)"
grep_bin="$(command -v grep)"
env_bin="$(command -v env)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
passed=0

# make_bin DIR UID INSTALLED WITH_SUDO: a PATH directory of fakes.
make_bin() {
  local dir=$1 uid=$2 installed=$3 with_sudo=$4
  mkdir -p "$dir"
  ln -s "$grep_bin" "$dir/grep"
  cat > "$dir/id" <<EOT
#!$bash_bin
[ "\$1" = "-u" ] && echo $uid
EOT
  cat > "$dir/dpkg-query" <<EOT
#!$bash_bin
# dpkg-query -W -f='\${Status}' PKG
if [ "$installed" = yes ]; then printf 'install ok installed'; else exit 1; fi
EOT
  cat > "$dir/apt-get" <<EOT
#!$bash_bin
echo "apt-get uid=\$FAKE_UID frontend=\${DEBIAN_FRONTEND:-unset} \$*" >> "$dir/log"
EOT
  if [ "$with_sudo" = yes ]; then
    cat > "$dir/sudo" <<EOT
#!$bash_bin
# Like sudo: a clean environment unless --preserve-env names a variable.
echo "sudo \$*" >> "$dir/log"
keep=()
while [ "\$#" -gt 0 ]; do
  case "\$1" in
    --preserve-env=*) IFS=, read -ra names <<< "\${1#--preserve-env=}"
                      for n in "\${names[@]}"; do keep+=("\$n=\${!n-}"); done; shift ;;
    -E) echo "fake sudo: -E is refused by this policy" >&2; exit 1 ;;
    -*) shift ;;
    *) break ;;
  esac
done
exec $env_bin -i PATH="\$PATH" FAKE_UID=0 "\${keep[@]}" "\$@"
EOT
  fi
  chmod +x "$dir"/*
  : > "$dir/log"
}

# run_case NAME UID INSTALLED WITH_SUDO: runs the script, leaves rc/out/log.
run_case() {
  local dir="$work/$1"
  make_bin "$dir" "$2" "$3" "$4"
  out=$(env -i PATH="$dir" FAKE_UID="$2" HOME="$work" "$bash_bin" "$script" 2>&1)
  rc=$?
  log=$(cat "$dir/log")
}

check() {  # check NAME CONDITION-DESCRIPTION COMMAND...
  local name=$1 what=$2
  shift 2
  if "$@"; then
    passed=$((passed + 1))
  else
    failures=$((failures + 1))
    echo "FAIL [$name] $what"
    echo "  exit=$rc output: $out"
    echo "  log: $log"
  fi
}

has() { printf '%s\n' "$log" | "$grep_bin" -q -- "$1"; }

run_case root 0 no no
check root "exits 0" test "$rc" -eq 0
check root "apt-get update ran as root" has '^apt-get uid=0 .* update'
check root "apt-get install ran as root with DEBIAN_FRONTEND" \
  has '^apt-get uid=0 frontend=noninteractive install -y -qq --no-install-recommends .*libibverbs-dev'
check root "no sudo" bash -c "! printf '%s' \"\$1\" | grep -q '^sudo'" _ "$log"

run_case sudo-user 1000 no yes
check sudo-user "exits 0" test "$rc" -eq 0
check sudo-user "update through sudo" has '^sudo .*apt-get update'
check sudo-user "install through sudo, keeping DEBIAN_FRONTEND" \
  has '^apt-get uid=0 frontend=noninteractive install .*libibverbs-dev'

run_case no-sudo 1000 no no
check no-sudo "exits non-zero" test "$rc" -ne 0
check no-sudo "one line" test "$(printf '%s\n' "$out" | wc -l)" -eq 1
check no-sudo "says root or sudo is needed" bash -c "printf '%s' \"\$1\" | grep -q 'not root and no sudo'" _ "$out"
check no-sudo "no apt-get" test -z "$log"

run_case installed 1000 yes yes
check installed "exits 0" test "$rc" -eq 0
check installed "no apt-get and no sudo" test -z "$log"
check installed "prints nothing" test -z "$out"

echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
