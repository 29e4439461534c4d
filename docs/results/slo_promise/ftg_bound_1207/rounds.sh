#!/bin/bash
# Rounds of the base (--no-first-token-guard) against --first-token-guard, one engine, 60 s
# at 4 and 6 req/s: ../tbt_guard_1207/rounds.sh with the first-token guard's flag. Odd
# rounds run the guard first (as "rotasched", the base as the variant "base"), even rounds
# the base first (the guard as the variant "ftg"). Ran as:
#   TREE=/tmp/chg2 PREFIX=g bash rounds.sh classes 1 2 3 4    # results in /tmp/mt/g1 ... g4
GUARD=first-token-guard VARIANT=ftg exec bash "$(dirname "$0")/../tbt_guard_1207/rounds.sh" "$@"
