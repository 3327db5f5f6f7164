// The kernel's huge page settings for tests that need them, changed for the test's scope and
// put back after: the huge page pool (/proc/sys/vm/nr_hugepages) and whether memfds may take
// transparent huge pages (shmem_enabled). Root only; tests using them hold the ctest lock
// kernel_huge_pages (stash_add_test LOCKS) so no two change them at once.
#ifndef STASH_TESTS_HUGE_PAGE_POOL_H_
#define STASH_TESTS_HUGE_PAGE_POOL_H_

#include <unistd.h>

#include <fstream>
#include <string>

#include "common/shm.h"

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

// shmem_enabled set to another word for the scope ("advise": memfds take transparent huge
// pages when asked).
class ShmemHugePages {
 public:
  static bool Changeable() { return geteuid() == 0 && !ShmemHugePageSetting().empty(); }
  ShmemHugePages() : before_(ShmemHugePageSetting()) {}
  ShmemHugePages(const ShmemHugePages&) = delete;
  ShmemHugePages& operator=(const ShmemHugePages&) = delete;
  ~ShmemHugePages() { Set(before_); }
  // Whether the kernel took `setting`.
  bool Set(const std::string& setting) {
    std::ofstream out("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    out << setting;
    out.flush();
    return out.good() && ShmemHugePageSetting() == setting;
  }

 private:
  const std::string before_;
};

}  // namespace stash::testing

#endif  // STASH_TESTS_HUGE_PAGE_POOL_H_
