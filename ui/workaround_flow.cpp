// SPDX-License-Identifier: Apache-2.0
#include "ui/workaround_flow.h"

#include <QDir>
#include <QFileInfo>
#include <QObject>
#include <QStringList>

#include "core/experiment/command_line.h"
#include "core/experiment/provenance.h"
#include "core/experiment/runner.h"
#include "ui/qt_text.h"

namespace batchlens::ui {

QString workaroundBlocker(const base::SystemInfo& system,
                          const experiment::ExperimentResult& result) {
  const std::string& device = result.spec.load.device;
  const QString ran_on =
      result.provenance.device_name.empty()
          ? q(device)
          : QStringLiteral("%1 (%2)").arg(q(device), q(result.provenance.device_name));
  if (device.rfind("cuda", 0) == 0) {
    if (!system.cuda_build) {
      return QObject::tr("The shown experiment ran on %1; this build has no CUDA.").arg(ran_on);
    }
    const int index = device.size() > 5 && device[4] == ':'
                          ? QString::fromStdString(device.substr(5)).toInt()
                          : 0;
    const base::GpuInfo* gpu = nullptr;
    for (const auto& g : system.gpus) {
      if (g.index == index) {
        gpu = &g;
      }
    }
    if (gpu == nullptr) {
      return QObject::tr("The shown experiment ran on %1; this machine has no such GPU.")
          .arg(ran_on);
    }
    if (!result.provenance.device_name.empty() && gpu->name != result.provenance.device_name) {
      return QObject::tr(
                 "The shown experiment ran on %1; this machine's cuda:%2 is a %3, whose kernels "
                 "differ.")
          .arg(ran_on)
          .arg(index)
          .arg(q(gpu->name));
    }
  } else if (device != "cpu") {
    return QObject::tr("The shown experiment ran on %1, which this build cannot use.").arg(ran_on);
  }
  // One file, one provenance: runs added here must compute as the shown ones did.
  const std::vector<std::string> differences = experiment::extension_mismatches(
      result, experiment::provenance_of(system, result.spec.load, false));
  if (!differences.empty()) {
    QStringList list;
    for (const std::string& d : differences) {
      list << q(d);
    }
    return QObject::tr(
               "The shown experiment ran on %1 with other kernels than this machine and build "
               "would use (%2): workaround runs computed here would not be comparable with its "
               "runs.")
        .arg(ran_on, list.join(QStringLiteral("; ")));
  }
  if (result.spec.model.preset.empty()) {
    const QString dir = QString::fromStdString(result.spec.model.checkpoint_dir.string());
    if (!QFileInfo(QDir(dir).filePath(QStringLiteral("config.json"))).isFile()) {
      return QObject::tr("The shown experiment's checkpoint directory %1 is not on this machine.")
          .arg(dir);
    }
  }
  return {};
}

const ops::EmulationProfile& profileStandingFor(const experiment::Provenance& provenance,
                                                bool* exact) {
  const auto& profiles = ops::emulation_profiles();
  for (const ops::EmulationProfile& p : profiles) {
    if (provenance.device_name.find(p.gpu) != std::string::npos) {
      if (exact != nullptr) {
        *exact = true;
      }
      return p;
    }
  }
  if (exact != nullptr) {
    *exact = false;
  }
  return profiles.front();
}

QString serverCommand(const experiment::ExperimentResult& result, const ops::OpPolicy& workaround,
                      const QString& stem) {
  experiment::ExperimentSpec spec = result.spec;
  spec.workaround = workaround;
  const QString out =
      (stem.isEmpty() ? QStringLiteral("experiment") : stem) + QStringLiteral("-workaround.h5");
  return QString::fromStdString(
      experiment::cli_run_command(spec, result.prompt_ids, out.toStdString()));
}

}  // namespace batchlens::ui
