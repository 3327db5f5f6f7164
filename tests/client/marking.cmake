# Marking rules of the client library (client/api/marking.cc): pure C++, no daemon or gRPC.
stash_add_test(marking_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/marking_test.cc
  ${PROJECT_SOURCE_DIR}/client/api/marking.cc LIBS stash::headers)
