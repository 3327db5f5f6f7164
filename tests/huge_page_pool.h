// The kernel's huge page pool (/proc/sys/vm/nr_hugepages) for tests that need reserved huge
// pages: grown by a number of pages for the test's scope and put back after. Root only; tests
// using it hold the ctest lock kernel_huge_pages (stash_add_test LOCKS) so no two change it at
// once.
#ifndef STASH_TESTS_HUGE_PAGE_POOL_H_
#define STASH_TESTS_HUGE_PAGE_POOL_H_

#include <unistd.h>

#include <fstream>
#include <string>

namespace stash::testing {

class HugePagePool {
 public:
  // Whether this process may change the pool (root, and the file is there).
  static bool Changeable() { return geteuid() == 0 && Reserved() >= 0; }
  // HugePages_Free less HugePages_Rsvd of /proc/meminfo.
  static long Free() {
    std::ifstream in("/proc/meminfo");
    std::string key, rest;
    long value = 0, free = 0, rsvd = 0;
    while (in >> key >> value) {
      std::getline(in, rest);
      if (key == "HugePages_Free:") free = value;
      if (key == "HugePages_Rsvd:") rsvd = value;
    }
    return free - rsvd;
  }

  HugePagePool() : before_(Reserved()) {}
  HugePagePool(const HugePagePool&) = delete;
  HugePagePool& operator=(const HugePagePool&) = delete;
  ~HugePagePool() { Set(before_); }
  // Reserves `pages` more than before this object; whether the kernel took the setting.
  bool Grow(long pages) { return Set(before_ + pages); }

 private:
  static constexpr const char* kKnob = "/proc/sys/vm/nr_hugepages";
  static long Reserved() {
    long pages = -1;
    std::ifstream in(kKnob);
    in >> pages;
    return pages;
  }
  static bool Set(long pages) {
    std::ofstream out(kKnob);
    out << pages;
    out.flush();
    return out.good();
  }
  const long before_;
};

}  // namespace stash::testing

#endif  // STASH_TESTS_HUGE_PAGE_POOL_H_
