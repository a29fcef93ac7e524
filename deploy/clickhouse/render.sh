#!/bin/sh
# grants.sql or users.d/meridian.xml with the two users' password hashes filled in:
#   render.sh FILE AGENT_PASSWORD_FILE READER_PASSWORD_FILE
# Each password file holds one password; its final newline is not part of it (as for
# the agent's clickhouse.password_file and the Secret made from the same file).
set -eu
sha() { printf %s "$(cat "$1")" | sha256sum | cut -d' ' -f1; }
agent=$(sha "$2")
reader=$(sha "$3")
sed -e "s/@MERIDIAN_PASSWORD_SHA256@/$agent/" -e "s/@READER_PASSWORD_SHA256@/$reader/" "$1"
