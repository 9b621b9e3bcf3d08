// SPDX-License-Identifier: Apache-2.0
// QCustomPlot through the QT_NO_KEYWORDS shim, next to LibTorch headers in one TU: the two
// must coexist in batchlens_ui (docs/build.md, the `slots` clash).
#include "ui/qcp.h"

#include <ATen/ATen.h>
#include <QTemporaryDir>
#include <gtest/gtest.h>

namespace batchlens::ui {
namespace {

TEST(QcpShim, ColorMapFromTensorRendersToPng) {
  const at::Tensor values = at::arange(12, at::kFloat).reshape({3, 4});  // [layers, steps]
  QCustomPlot plot;
  plot.resize(400, 300);
  auto* map = new QCPColorMap(plot.xAxis, plot.yAxis);
  map->data()->setSize(4, 3);
  map->data()->setRange(QCPRange(0, 3), QCPRange(0, 2));
  const auto acc = values.accessor<float, 2>();
  for (int layer = 0; layer < 3; ++layer) {
    for (int step = 0; step < 4; ++step) {
      map->data()->setCell(step, layer, acc[layer][step]);
    }
  }
  map->rescaleDataRange();
  EXPECT_DOUBLE_EQ(map->data()->cell(3, 2), 11.0);
  EXPECT_DOUBLE_EQ(map->dataRange().upper, 11.0);

  QTemporaryDir dir;
  ASSERT_TRUE(dir.isValid());
  const QString path = dir.filePath(QStringLiteral("map.png"));
  ASSERT_TRUE(plot.savePng(path, 400, 300));
  QImage image(path);
  EXPECT_EQ(image.width(), 400);
  EXPECT_EQ(image.height(), 300);
}

}  // namespace
}  // namespace batchlens::ui
