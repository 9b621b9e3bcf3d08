// SPDX-License-Identifier: Apache-2.0
// GoogleTest main for ui tests: one QApplication on the offscreen platform, created before any
// test (and before --gtest_list_tests, which must not need a display either).
#include <QApplication>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
