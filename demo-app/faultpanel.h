// The fault panel of a chat window: the client's QA hooks (offline, drop
// the next reply, close the socket), the request timeout, the server's
// fault points (imserver --enable-faults, POST /lab/fault), and the
// "silent server" (a local proxy that stops forwarding, faultproxy.h).
#pragma once

#include "signindialog.h"

#include <QtCore/QList>
#include <QtWidgets/QGroupBox>

namespace im {
class Client;
namespace testing {
class Faults;
}
} // namespace im

class FaultClient;
class FaultProxy;
class QCheckBox;
class QComboBox;
class QLabel;
class QPushButton;
class QSpinBox;

class FaultPanel : public QGroupBox {
    Q_OBJECT
public:
    FaultPanel(const Session &session, im::Client *client, im::testing::Faults *faults, QWidget *parent = nullptr);

    /// The server the lab endpoint belongs to: the one connected to (the
    /// real server behind the proxy when routed), else the first listed.
    QUrl labServer() const;
    /// Refreshes "Lab endpoint: ..." (the connected server may change).
    void updateLabUrl();
    /// True while the client's servers are the local proxies.
    bool isRouted() const { return !proxies_.isEmpty(); }
    /// The proxies (one per server URL) while routed.
    QList<FaultProxy *> proxies() const { return proxies_; }

public Q_SLOTS:
    /// Routes the client through the local fault proxy (one per server URL)
    /// or back to the servers themselves; reconnects at the new address.
    void setRouted(bool on);
    /// Silences every connection the proxies hold now (see FaultProxy::silence).
    void silenceServer();

Q_SIGNALS:
    void statusMessage(const QString &text, int timeoutMs);
    /// "Send a burst" (QA): the window sends `count` messages to its
    /// conversation at once, past the server's --send-burst, to show
    /// RATE_LIMITED: the drafts wait the server's retry_ms, then go out.
    void burstRequested(int count);
    /// "Restart this window" (QA): the window manager closes this window
    /// (its client and store, as a quit app) and opens it again on the same
    /// store, so an upload under way resumes from the durable outbox.
    void restartRequested();

private:
    void armServerFault(bool off);
    /// "Damage the store's copy" (QA): flips the last byte of the store's
    /// copy of the oldest file still uploading (<database>.files/outgoing/<cmid>).
    void damageStoreCopy();
    void updateProxyLabel();

    Session session_;
    im::Client *client_;
    im::testing::Faults *faults_;
    FaultClient *labClient_;
    QList<FaultProxy *> proxies_;
    QPushButton *offlineButton_;
    QSpinBox *timeoutSpin_;
    QComboBox *faultPoint_;
    QComboBox *faultAction_;
    QSpinBox *faultCount_;
    QLabel *faultAnswer_;
    QLabel *labUrlLabel_;
    QCheckBox *routeCheck_;
    QPushButton *silenceButton_;
    QLabel *proxyLabel_;
};
