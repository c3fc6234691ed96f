#!/bin/sh
# Install Debian packages for an optional piece of `make test`, as root or through sudo; where
# that is impossible, say what will skip and carry on (exit 0).
# usage: sh scripts/apt_install.sh "what skips without them" PACKAGE...
why=$1
shift
if [ "$(id -u)" = 0 ]; then
    sudo=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo="sudo"
else
    echo "warning: $* missing and no root to apt-get them: $why"
    exit 0
fi
$sudo apt-get update -qq && $sudo apt-get install -y -qq "$@" >/dev/null \
    || echo "warning: could not install $*: $why"
