// SPDX-License-Identifier: Apache-2.0
// Behaviour every widget of the application shares, from one event filter on QApplication
// (installed by MainWindow; issue #34):
// - the mouse wheel scrolls the form it is over: spin boxes and combo boxes change their value
//   by wheel only while they have the keyboard focus (scrolling the Run dock turned New tokens
//   from 32 into 17);
// - long tooltips wrap (some ran to 1400 px on one line).
#pragma once

#include <QObject>
#include <QString>

namespace batchlens::ui {

/// `text` as a tooltip that wraps: long plain text becomes rich text (which Qt word-wraps),
/// line breaks kept; short or already rich text is returned as it is.
QString wrappedToolTip(const QString& text);

/// The event filter. A wheel event over a QAbstractSpinBox or QComboBox without focus goes to
/// its parent instead (the scroll area around it scrolls); with focus it changes the value as
/// usual. Such widgets take focus by click or Tab, never by wheel. A widget's long plain
/// tooltip is shown wrapped.
class AppFilter : public QObject {
  Q_OBJECT

 public:
  explicit AppFilter(QObject* parent = nullptr) : QObject(parent) {}

  /// Installs one filter on the application (a second call does nothing).
  static void install();

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;
};

}  // namespace batchlens::ui
