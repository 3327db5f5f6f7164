# stashd --metrics-listen: promtool lints the page, a real Prometheus scrapes it (issue 15).
# Needs python3-pytest and Debian's `prometheus` (promtool, prometheus); skips without them.
add_test(NAME integration.metrics
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
          ${CMAKE_CURRENT_SOURCE_DIR}/metrics_test.py)
set_tests_properties(integration.metrics PROPERTIES
  ENVIRONMENT "STASHD_BIN_DIR=${PROJECT_BINARY_DIR}"
  LABELS integration
  TIMEOUT 300)
