// SPDX-License-Identifier: Apache-2.0
#include "ui/app_filter.h"

#include <QAbstractSpinBox>
#include <QApplication>
#include <QComboBox>
#include <QEvent>
#include <QTextDocument>
#include <QWidget>

namespace batchlens::ui {

namespace {

// Longer plain tooltips than this are wrapped.
constexpr int kWrapAfterChars = 90;

bool takesWheelOnlyWithFocus(const QWidget* w) {
  return qobject_cast<const QAbstractSpinBox*>(w) != nullptr ||
         qobject_cast<const QComboBox*>(w) != nullptr;
}

}  // namespace

QString wrappedToolTip(const QString& text) {
  if (text.size() <= kWrapAfterChars || Qt::mightBeRichText(text)) {
    return text;
  }
  QString html = text.toHtmlEscaped();
  html.replace(QLatin1Char('\n'), QStringLiteral("<br>"));
  return QStringLiteral("<p>%1</p>").arg(html);
}

void AppFilter::install() {
  if (qApp == nullptr || qApp->findChild<AppFilter*>(QString(), Qt::FindDirectChildrenOnly)) {
    return;
  }
  qApp->installEventFilter(new AppFilter(qApp));
}

bool AppFilter::eventFilter(QObject* watched, QEvent* event) {
  auto* w = qobject_cast<QWidget*>(watched);
  if (w == nullptr) {
    return false;
  }
  switch (event->type()) {
    case QEvent::Polish:
    case QEvent::FocusIn:
      if (takesWheelOnlyWithFocus(w) && w->focusPolicy() == Qt::WheelFocus) {
        w->setFocusPolicy(Qt::StrongFocus);
      }
      return false;
    case QEvent::ToolTip:
      if (const QString tip = w->toolTip(); !tip.isEmpty()) {
        if (const QString wrapped = wrappedToolTip(tip); wrapped != tip) {
          w->setToolTip(wrapped);  // shown by the default handler after this filter
        }
      }
      return false;
    case QEvent::Wheel:
      if (!takesWheelOnlyWithFocus(w) || w->hasFocus()) {
        return false;
      }
      // Not focused: the value stays; the widgets around it (a scroll area) get the wheel.
      if (QWidget* parent = w->parentWidget(); parent != nullptr) {
        QApplication::sendEvent(parent, event);
      }
      return true;
    default:
      return false;
  }
}

}  // namespace batchlens::ui
