# Operators (issue 15): --metrics-listen (promtool lints the page, a real Prometheus scrapes it)
# and sd_notify readiness.
# Needs python3-pytest and Debian's `prometheus` (promtool, prometheus); skips without them.
add_test(NAME integration.metrics
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
          ${CMAKE_CURRENT_SOURCE_DIR}/metrics_test.py)
set_tests_properties(integration.metrics PROPERTIES
  ENVIRONMENT "STASHD_BIN_DIR=${PROJECT_BINARY_DIR}"
  LABELS integration
  TIMEOUT 300)

# stashd under systemd's Type=notify: READY=1 once serving, STOPPING=1 on SIGTERM.
add_test(NAME integration.systemd
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
          ${CMAKE_CURRENT_SOURCE_DIR}/systemd_test.py)
set_tests_properties(integration.systemd PROPERTIES
  ENVIRONMENT "STASHD_BIN_DIR=${PROJECT_BINARY_DIR}"
  LABELS integration
  TIMEOUT 120)
