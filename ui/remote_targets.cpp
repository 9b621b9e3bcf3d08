// SPDX-License-Identifier: Apache-2.0
#include "ui/remote_targets.h"

#include <memory>
#include <utility>

#include <QCoreApplication>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPointer>
#include <QProcess>
#include <QPushButton>
#include <QSettings>
#include <QTableWidget>
#include <QThread>
#include <QVBoxLayout>

#include "ui/controllers.h"
#include "ui/qt_text.h"

namespace batchlens::ui {

QString RemoteTarget::name() const {
  return q(ssh.describe());
}

QString RemoteTarget::status() const {
  if (!error.isEmpty()) {
    return error;
  }
  if (!info) {
    return QObject::tr("not probed yet");
  }
  QStringList devices;
  for (const std::string& d : info->devices) {
    devices << q(d);
  }
  return QObject::tr("BatchLens %1, LibTorch %2, host %3: %4")
      .arg(q(info->version), q(info->libtorch), q(info->hostname),
           devices.join(QStringLiteral(", ")));
}

std::vector<RemoteTarget> loadRemoteTargets(QSettings& settings) {
  std::vector<RemoteTarget> out;
  const int n = settings.beginReadArray(QStringLiteral("remote/targets"));
  for (int i = 0; i < n; ++i) {
    settings.setArrayIndex(i);
    const QString host = settings.value(QStringLiteral("host")).toString();
    auto parsed = remote::parse_target(host.toStdString());
    if (!parsed.ok()) {
      continue;  // edited by hand or by another version: skipped, never passed to ssh
    }
    RemoteTarget t;
    t.ssh = std::move(parsed).value();
    t.ssh.cli = settings.value(QStringLiteral("cli"), q(t.ssh.cli)).toString().toStdString();
    t.ssh.workdir =
        settings.value(QStringLiteral("workdir"), q(t.ssh.workdir)).toString().toStdString();
    for (const QString& o : settings.value(QStringLiteral("ssh_options")).toStringList()) {
      t.ssh.ssh_options.push_back(o.toStdString());
    }
    if (settings.contains(QStringLiteral("version"))) {
      remote::TargetInfo info;
      info.version = settings.value(QStringLiteral("version")).toString().toStdString();
      info.libtorch = settings.value(QStringLiteral("libtorch")).toString().toStdString();
      info.hostname = settings.value(QStringLiteral("hostname")).toString().toStdString();
      for (const QString& d : settings.value(QStringLiteral("devices")).toStringList()) {
        info.devices.push_back(d.toStdString());
      }
      info.schema_major = settings.value(QStringLiteral("schema_major")).toInt();
      info.schema_minor = settings.value(QStringLiteral("schema_minor")).toInt();
      t.info = std::move(info);
    }
    t.error = settings.value(QStringLiteral("error")).toString();
    out.push_back(std::move(t));
  }
  settings.endArray();
  return out;
}

void saveRemoteTargets(QSettings& settings, const std::vector<RemoteTarget>& targets) {
  settings.remove(QStringLiteral("remote/targets"));
  settings.beginWriteArray(QStringLiteral("remote/targets"), static_cast<int>(targets.size()));
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const RemoteTarget& t = targets[i];
    settings.setArrayIndex(static_cast<int>(i));
    settings.setValue(QStringLiteral("host"), t.name());
    settings.setValue(QStringLiteral("cli"), q(t.ssh.cli));
    settings.setValue(QStringLiteral("workdir"), q(t.ssh.workdir));
    QStringList options;
    for (const std::string& o : t.ssh.ssh_options) {
      options << q(o);
    }
    settings.setValue(QStringLiteral("ssh_options"), options);
    if (t.info) {
      settings.setValue(QStringLiteral("version"), q(t.info->version));
      settings.setValue(QStringLiteral("libtorch"), q(t.info->libtorch));
      settings.setValue(QStringLiteral("hostname"), q(t.info->hostname));
      QStringList devices;
      for (const std::string& d : t.info->devices) {
        devices << q(d);
      }
      settings.setValue(QStringLiteral("devices"), devices);
      settings.setValue(QStringLiteral("schema_major"), t.info->schema_major);
      settings.setValue(QStringLiteral("schema_minor"), t.info->schema_minor);
    }
    settings.setValue(QStringLiteral("error"), t.error);
  }
  settings.endArray();
}

RemoteTarget probeTarget(RemoteTarget target) {
  auto info = remote::probe(target.ssh);
  if (info.ok()) {
    target.info = std::move(info).value();
    target.error.clear();
  } else {
    target.error = q(info.error().message);
  }
  return target;
}

int targetRecordedOn(const std::vector<RemoteTarget>& targets, const std::string& host,
                     const std::string& device_name) {
  if (host.empty()) {
    return -1;
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const auto& info = targets[i].info;
    if (!info || info->hostname != host) {
      continue;
    }
    for (const std::string& d : info->devices) {
      if (device_name.empty() || d.find("(" + device_name + ")") != std::string::npos) {
        return static_cast<int>(i);
      }
    }
  }
  return -1;
}

namespace {

// The table's columns: target, batchlens-cli, work folder, last probe.
constexpr int kTargetColumnName = 0;
constexpr int kTargetColumnStatus = 3;

}  // namespace

RemoteTargetsDialog::RemoteTargetsDialog(std::vector<RemoteTarget> targets, QWidget* parent)
    : QDialog(parent), targets_(std::move(targets)), threads_(std::make_unique<ThreadSet>()) {
  setObjectName(QStringLiteral("RemoteTargetsDialog"));
  setWindowTitle(tr("SSH targets"));
  auto* intro = new QLabel(
      tr("GPU servers BatchLens runs on over your own OpenSSH: your keys, agent, ~/.ssh/config "
         "and known_hosts. No password is ever asked for (BatchMode) and no host key is "
         "accepted for you: log in once with <tt>ssh HOST</tt> first. The target needs "
         "<tt>batchlens-cli</tt> of a version that writes files this BatchLens reads."),
      this);
  intro->setWordWrap(true);
  host_ = new QLineEdit(this);
  host_->setObjectName(QStringLiteral("TargetHostEdit"));
  host_->setPlaceholderText(tr("gpu-server, user@host or user@host:2222"));
  host_->setToolTip(tr("An alias of ~/.ssh/config, a host, user@host or user@host:port"));
  cli_ = new QLineEdit(QStringLiteral("batchlens-cli"), this);
  cli_->setObjectName(QStringLiteral("TargetCliEdit"));
  cli_->setToolTip(tr("batchlens-cli on the target: a name on its PATH or a path"));
  workdir_ = new QLineEdit(QStringLiteral("batchlens-runs"), this);
  workdir_->setObjectName(QStringLiteral("TargetWorkdirEdit"));
  workdir_->setToolTip(
      tr("Where the target keeps the files of its runs (made; relative to the login folder). "
         "A file stays there after it came back: a dropped connection loses nothing."));
  ssh_options_ = new QLineEdit(this);
  ssh_options_->setObjectName(QStringLiteral("TargetSshOptionsEdit"));
  ssh_options_->setPlaceholderText(tr("optional, e.g. -o ConnectTimeout=10"));
  ssh_options_->setToolTip(
      tr("More arguments for ssh, split at spaces (double quotes keep a path with spaces whole)"));
  add_ = new QPushButton(tr("&Add and probe"), this);
  add_->setObjectName(QStringLiteral("TargetAddButton"));
  auto* form = new QFormLayout;
  form->addRow(tr("Target"), host_);
  form->addRow(tr("batchlens-cli there"), cli_);
  form->addRow(tr("Work folder there"), workdir_);
  form->addRow(tr("ssh options"), ssh_options_);
  form->addRow(QString(), add_);

  table_ = new QTableWidget(0, 4, this);
  table_->setObjectName(QStringLiteral("TargetTable"));
  table_->setHorizontalHeaderLabels(
      {tr("Target"), tr("batchlens-cli"), tr("Work folder"), tr("Last probe")});
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->verticalHeader()->hide();
  remove_ = new QPushButton(tr("&Remove"), this);
  remove_->setObjectName(QStringLiteral("TargetRemoveButton"));
  probe_ = new QPushButton(tr("&Probe all"), this);
  probe_->setObjectName(QStringLiteral("TargetProbeButton"));
  probe_->setToolTip(tr("Ask every target what it has (batchlens-cli info --json over ssh)"));
  message_ = new QLabel(this);
  message_->setObjectName(QStringLiteral("TargetMessage"));
  message_->setWordWrap(true);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);

  auto* row = new QHBoxLayout;
  row->addWidget(remove_);
  row->addWidget(probe_);
  row->addStretch(1);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(intro);
  layout->addLayout(form);
  layout->addWidget(table_, 1);
  layout->addLayout(row);
  layout->addWidget(message_);
  layout->addWidget(buttons);
  resize(760, 440);

  connect(add_, &QPushButton::clicked, this, [this] { addFromFields(); });
  connect(host_, &QLineEdit::returnPressed, this, [this] { addFromFields(); });
  connect(remove_, &QPushButton::clicked, this, &RemoteTargetsDialog::removeSelected);
  connect(probe_, &QPushButton::clicked, this, &RemoteTargetsDialog::probeAll);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  refresh();
}

RemoteTargetsDialog::~RemoteTargetsDialog() = default;

bool RemoteTargetsDialog::addFromFields() {
  auto parsed = remote::parse_target(host_->text().trimmed().toStdString());
  if (!parsed.ok()) {
    message_->setText(tr("Not added: %1.").arg(q(parsed.error().message)));
    return false;
  }
  RemoteTarget t;
  t.ssh = std::move(parsed).value();
  for (const auto& existing : targets_) {
    if (existing.ssh.describe() == t.ssh.describe()) {
      message_->setText(tr("%1 is listed already.").arg(t.name()));
      return false;
    }
  }
  const QString cli = cli_->text().trimmed();
  const QString workdir = workdir_->text().trimmed();
  if (cli.isEmpty() || workdir.isEmpty()) {
    message_->setText(tr("Not added: name batchlens-cli there and a work folder."));
    return false;
  }
  t.ssh.cli = cli.toStdString();
  t.ssh.workdir = workdir.toStdString();
  for (const QString& o : QProcess::splitCommand(ssh_options_->text())) {
    t.ssh.ssh_options.push_back(o.toStdString());
  }
  targets_.push_back(std::move(t));
  host_->clear();
  refresh();
  probe(static_cast<int>(targets_.size()) - 1);
  return true;
}

void RemoteTargetsDialog::probeAll() {
  for (int i = 0; i < static_cast<int>(targets_.size()); ++i) {
    probe(i);
  }
}

void RemoteTargetsDialog::probe(int row) {
  if (row < 0 || row >= static_cast<int>(targets_.size())) {
    return;
  }
  ++probing_;
  targets_[static_cast<std::size_t>(row)].error.clear();
  refresh();
  table_->item(row, kTargetColumnStatus)->setText(tr("probing…"));
  message_->setText(tr("Probing %1…").arg(targets_[static_cast<std::size_t>(row)].name()));
  QPointer<RemoteTargetsDialog> self(this);
  const int generation = generation_;
  QThread* thread = QThread::create([self, generation, row,
                                     target = targets_[static_cast<std::size_t>(row)]] {
    RemoteTarget answered = probeTarget(target);
    QMetaObject::invokeMethod(
        QCoreApplication::instance(),
        [self, generation, row, answered] {
          if (self.isNull()) {
            return;
          }
          --self->probing_;
          if (generation == self->generation_ && row < static_cast<int>(self->targets_.size())) {
            self->targets_[static_cast<std::size_t>(row)] = answered;
            self->message_->setText(
                answered.error.isEmpty()
                    ? tr("%1 answered: %2").arg(answered.name(), answered.status())
                    : tr("%1: %2").arg(answered.name(), answered.error));
          }
          self->refresh();
          if (self->probing_ == 0) {
            Q_EMIT self->probed();
          }
        },
        Qt::QueuedConnection);
  });
  threads_->start(thread);
}

void RemoteTargetsDialog::removeSelected() {
  const int row = table_->currentRow();
  if (row < 0 || row >= static_cast<int>(targets_.size())) {
    return;
  }
  targets_.erase(targets_.begin() + row);
  ++generation_;  // a probe still running answers for a row that moved
  refresh();
}

void RemoteTargetsDialog::refresh() {
  table_->setRowCount(static_cast<int>(targets_.size()));
  for (int i = 0; i < static_cast<int>(targets_.size()); ++i) {
    const RemoteTarget& t = targets_[static_cast<std::size_t>(i)];
    const QString options = [&] {
      QStringList list;
      for (const std::string& o : t.ssh.ssh_options) {
        list << q(o);
      }
      return list.join(QLatin1Char(' '));
    }();
    const QStringList cells{t.name(), q(t.ssh.cli), q(t.ssh.workdir), t.status()};
    for (int c = 0; c < cells.size(); ++c) {
      auto* item = new QTableWidgetItem(cells[c]);
      item->setToolTip(c == kTargetColumnName && !options.isEmpty()
                           ? tr("%1 (ssh options: %2)").arg(cells[c], options)
                           : cells[c]);
      if (c == kTargetColumnStatus && !t.error.isEmpty()) {
        item->setForeground(QColor(0xa5, 0x00, 0x26));
      }
      table_->setItem(i, c, item);
    }
  }
  table_->resizeColumnsToContents();
  remove_->setEnabled(!targets_.empty());
  probe_->setEnabled(!targets_.empty());
}

}  // namespace batchlens::ui
