// stashctl: hands argv to the library (client/stashctl/stashctl.h), which parses the flags and
// runs the command, so tests exercise exactly what users run.
#include <unistd.h>

#include <iostream>

#include "client/stashctl/stashctl.h"

int main(int argc, char** argv) {
  return stash::stashctl::RunStashctl(argc, argv, std::cout, std::cerr,
                                      /*out_is_tty=*/isatty(STDOUT_FILENO) == 1);
}
