// The client settings panel of a chat window: what the public im::Client
// API lets an app tune about sending and the connection. The SDK has
// setters and no getters for these, so the panel applies all of its values
// to the client when it is built (the SDK's defaults, docs/sdk.md) and again
// on every change: what the spin boxes show is what the client runs with.
#pragma once

#include <QtWidgets/QGroupBox>

namespace im {
class Client;
}

class QLabel;
class QSpinBox;

class SettingsPanel : public QGroupBox {
    Q_OBJECT
public:
    /// The SDK's defaults (docs/sdk.md).
    static constexpr int DefaultSendWindow = 128;
    static constexpr int DefaultPingMs = 10000;
    static constexpr int DefaultSilenceMs = 25000;
    static constexpr int DefaultReconnectInitialMs = 500;
    static constexpr int DefaultReconnectMaxMs = 30000;
    static constexpr int DefaultRetryInitialMs = 250;
    static constexpr int DefaultRetryMaxMs = 30000;
    static constexpr int DefaultUploadLimitKiB = 0; ///< Client::uploadRateLimit: unlimited

    explicit SettingsPanel(im::Client *client, QWidget *parent = nullptr);

    /// One line: what the client was last given ("send window 128, ...").
    QString appliedText() const;

public Q_SLOTS:
    /// All spin boxes back to the SDK's defaults (and applied).
    void restoreDefaults();

private:
    void applySendWindow();
    void applyKeepAlive();
    void applyReconnectBackoff();
    void applyRetryBackoff();
    void applyUploadLimit();
    void showApplied();

    im::Client *client_;
    QSpinBox *sendWindow_;
    QSpinBox *ping_;
    QSpinBox *silence_;
    QSpinBox *reconnectInitial_;
    QSpinBox *reconnectMax_;
    QSpinBox *retryInitial_;
    QSpinBox *retryMax_;
    QSpinBox *uploadLimit_;
    QLabel *applied_;
    int appliedWindow_ = 0;
    int appliedPing_ = 0, appliedSilence_ = 0;
    int appliedReconnect_[2] = {0, 0};
    int appliedRetry_[2] = {0, 0};
    qint64 appliedUploadLimit_ = 0; ///< bytes per second, 0 = unlimited
};
