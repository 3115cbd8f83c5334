"""The exit codes of `blackbox` and its commands, defined once (the site's exit codes reference
is generated from this file)."""

EXIT_OK = 0  # done
EXIT_FAILED = 1  # failed at run time: a crashed worker, a refused send, an answer that never came
EXIT_USAGE = 2  # refused before starting: bad arguments, settings or input
EXIT_SETTINGS = EXIT_USAGE  # the service's settings, Redis or the store topic refused at start
EXIT_FINDINGS = 3  # done, and it found something to act on: the audit's lost or late messages
# A cancel, pause, resume or reschedule blackbox answered without changing anything
# (not_found, already_fired, not_recurring, recurring, cancelled), or a show of an id it does
# not hold (not_found): done, and the script has something to act on.
EXIT_UNCHANGED = EXIT_FINDINGS
