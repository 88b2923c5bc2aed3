#include "settingspanel.h"

#include <im/client.h>

#include <QtWidgets/QFormLayout>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QLabel>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QSpinBox>

#include <algorithm>

namespace {

QSpinBox *spin(const QString &name, int min, int max, int value, const QString &suffix, const QString &tip) {
    auto *s = new QSpinBox;
    s->setObjectName(name);
    s->setRange(min, max);
    s->setValue(value);
    s->setSuffix(suffix);
    s->setToolTip(tip);
    s->setKeyboardTracking(false); // typing "2000" applies 2000, not 2, 20, 200 on the way
    s->setSingleStep(max >= 10000 ? 500 : 1);
    return s;
}

QHBoxLayout *pair(QSpinBox *a, const QString &between, QSpinBox *b) {
    auto *row = new QHBoxLayout;
    row->addWidget(a, 1);
    row->addWidget(new QLabel(between));
    row->addWidget(b, 1);
    return row;
}

} // namespace

SettingsPanel::SettingsPanel(im::Client *client, QWidget *parent)
    : QGroupBox(tr("Client settings"), parent), client_(client) {
    setObjectName(QStringLiteral("settingsPanel"));
    const QString ms = QStringLiteral(" ms");
    sendWindow_ = spin(QStringLiteral("sendWindowSpin"), 1, 1000, DefaultSendWindow, QString(),
                       tr("Client::setSendWindow(): outbox requests unanswered at once (1: one at a time; "
                          "watch the outbox's In flight and After (prev) columns)"));
    ping_ = spin(QStringLiteral("pingIntervalSpin"), 100, 600000, DefaultPingMs, ms,
                 tr("Client::setKeepAlive(): a WebSocket ping this often while connected"));
    silence_ = spin(QStringLiteral("silenceTimeoutSpin"), 100, 600000, DefaultSilenceMs, ms,
                    tr("Client::setKeepAlive(): nothing heard (no frame, no pong) this long: the connection is "
                       "dropped and reconnected (try it with Silence the server)"));
    reconnectInitial_ = spin(QStringLiteral("reconnectInitialSpin"), 1, 600000, DefaultReconnectInitialMs, ms,
                             tr("Client::setReconnectBackoff(): first wait before a reconnect"));
    reconnectMax_ = spin(QStringLiteral("reconnectMaxSpin"), 1, 600000, DefaultReconnectMaxMs, ms,
                         tr("Client::setReconnectBackoff(): the wait doubles up to this (jittered into [d/2, d])"));
    retryInitial_ = spin(QStringLiteral("retryInitialSpin"), 1, 600000, DefaultRetryInitialMs, ms,
                         tr("Client::setRetryBackoff(): first wait before resending an unanswered or UNAVAILABLE "
                            "request while connected"));
    retryMax_ = spin(QStringLiteral("retryMaxSpin"), 1, 600000, DefaultRetryMaxMs, ms,
                     tr("Client::setRetryBackoff(): the wait doubles up to this (jittered into [d/2, d])"));
    uploadLimit_ = spin(QStringLiteral("uploadLimitSpin"), 0, 1024 * 1024, DefaultUploadLimitKiB, QStringLiteral(" KiB/s"),
                        tr("Client::uploadRateLimit (QA: throttle the upload): at most this many KiB of file data a "
                           "second, paced PUTs; 0 = unlimited. Slow a large file down to kill the connection, "
                           "restart the window or corrupt a chunk mid-upload (Faults panel)"));
    uploadLimit_->setSpecialValueText(tr("unlimited"));
    uploadLimit_->setSingleStep(64);
    connect(sendWindow_, &QSpinBox::valueChanged, this, &SettingsPanel::applySendWindow);
    connect(uploadLimit_, &QSpinBox::valueChanged, this, &SettingsPanel::applyUploadLimit);
    connect(ping_, &QSpinBox::valueChanged, this, &SettingsPanel::applyKeepAlive);
    connect(silence_, &QSpinBox::valueChanged, this, &SettingsPanel::applyKeepAlive);
    connect(reconnectInitial_, &QSpinBox::valueChanged, this, &SettingsPanel::applyReconnectBackoff);
    connect(reconnectMax_, &QSpinBox::valueChanged, this, &SettingsPanel::applyReconnectBackoff);
    connect(retryInitial_, &QSpinBox::valueChanged, this, &SettingsPanel::applyRetryBackoff);
    connect(retryMax_, &QSpinBox::valueChanged, this, &SettingsPanel::applyRetryBackoff);

    applied_ = new QLabel;
    applied_->setObjectName(QStringLiteral("settingsApplied"));
    applied_->setWordWrap(true);
    applied_->setStyleSheet(QStringLiteral("color: gray"));
    auto *defaults = new QPushButton(tr("SDK defaults"));
    defaults->setObjectName(QStringLiteral("settingsDefaultsButton"));
    connect(defaults, &QPushButton::clicked, this, &SettingsPanel::restoreDefaults);

    auto *form = new QFormLayout(this);
    form->addRow(tr("Send window:"), sendWindow_);
    form->addRow(tr("Keepalive ping / silence:"), pair(ping_, QStringLiteral("/"), silence_));
    form->addRow(tr("Reconnect backoff:"), pair(reconnectInitial_, QStringLiteral("..."), reconnectMax_));
    form->addRow(tr("Retry backoff:"), pair(retryInitial_, QStringLiteral("..."), retryMax_));
    form->addRow(tr("Upload limit:"), uploadLimit_);
    auto *bottom = new QHBoxLayout;
    bottom->addWidget(applied_, 1);
    bottom->addWidget(defaults);
    form->addRow(bottom);

    applySendWindow();
    applyKeepAlive();
    applyReconnectBackoff();
    applyRetryBackoff();
    applyUploadLimit();
}

void SettingsPanel::applySendWindow() {
    appliedWindow_ = sendWindow_->value();
    client_->setSendWindow(appliedWindow_);
    showApplied();
}

void SettingsPanel::applyKeepAlive() {
    // The SDK takes silence >= ping; the panel shows what it gets.
    appliedPing_ = ping_->value();
    appliedSilence_ = std::max(silence_->value(), appliedPing_);
    client_->setKeepAlive(appliedPing_, appliedSilence_);
    showApplied();
}

void SettingsPanel::applyReconnectBackoff() {
    appliedReconnect_[0] = reconnectInitial_->value();
    appliedReconnect_[1] = std::max(reconnectMax_->value(), appliedReconnect_[0]);
    client_->setReconnectBackoff(appliedReconnect_[0], appliedReconnect_[1]);
    showApplied();
}

void SettingsPanel::applyRetryBackoff() {
    appliedRetry_[0] = retryInitial_->value();
    appliedRetry_[1] = std::max(retryMax_->value(), appliedRetry_[0]);
    client_->setRetryBackoff(appliedRetry_[0], appliedRetry_[1]);
    showApplied();
}

void SettingsPanel::applyUploadLimit() {
    client_->setUploadRateLimit(qint64(uploadLimit_->value()) * 1024);
    appliedUploadLimit_ = client_->uploadRateLimit();
    showApplied();
}

QString SettingsPanel::appliedText() const {
    return tr("Client runs with: send window %1, ping %2 ms, silence %3 ms, reconnect %4..%5 ms, retry %6..%7 ms, "
              "upload %8")
        .arg(appliedWindow_)
        .arg(appliedPing_)
        .arg(appliedSilence_)
        .arg(appliedReconnect_[0])
        .arg(appliedReconnect_[1])
        .arg(appliedRetry_[0])
        .arg(appliedRetry_[1])
        .arg(appliedUploadLimit_ > 0 ? tr("%1 B/s").arg(appliedUploadLimit_) : tr("unlimited"));
}

void SettingsPanel::showApplied() { applied_->setText(appliedText()); }

void SettingsPanel::restoreDefaults() {
    sendWindow_->setValue(DefaultSendWindow);
    ping_->setValue(DefaultPingMs);
    silence_->setValue(DefaultSilenceMs);
    reconnectInitial_->setValue(DefaultReconnectInitialMs);
    reconnectMax_->setValue(DefaultReconnectMaxMs);
    retryInitial_->setValue(DefaultRetryInitialMs);
    retryMax_->setValue(DefaultRetryMaxMs);
    uploadLimit_->setValue(DefaultUploadLimitKiB);
}
