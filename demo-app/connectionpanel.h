// The connection panel of a chat window: the connection indicator, who is
// signed in where (user, device, install, database, servers), which TLS
// trust is used, the last error, the token (expiry, requests for a new one,
// a field to hand one over), the STALE_INSTALL banner, Connect / Disconnect,
// Sync all / Resend.
#pragma once

#include "signindialog.h"

#include <QtWidgets/QGroupBox>

namespace im {
class Client;
namespace testing {
class Faults;
}
} // namespace im

class QCheckBox;
class QLabel;
class QLineEdit;
class QPushButton;

class ConnectionPanel : public QGroupBox {
    Q_OBJECT
public:
    ConnectionPanel(const Session &session, im::Client *client, im::testing::Faults *faults,
                    QWidget *parent = nullptr);

    /// What the panel says about TLS ("TLS: off (ws://)", ...). A CA file
    /// replaces the system trust store (im::Client::setTrustedCaFile).
    static QString tlsText(const Session &session);
    /// The connection indicator text (plain), e.g. "Connected - gateway gw-1 - URL".
    QString connectionText() const;
    /// Shows `text` as the last error (red).
    void setError(const QString &text);
    /// Re-reads the connection state and identity.
    void updateConnection();
    /// Called every 250 ms: the reconnect countdown and the token expiry.
    void tick();

Q_SIGNALS:
    void statusMessage(const QString &text, int timeoutMs);

private:
    void updateIdentity();
    /// "Token expires in N s" (obligation 14): from Client::tokenExpiresAt.
    void updateTokenExpiry();

    Session session_;
    im::Client *client_;
    im::testing::Faults *faults_;
    QLabel *connLabel_;
    QLabel *identityLabel_;
    QLabel *errorLabel_;
    QLabel *tokenExpiryLabel_;
    QLabel *credentialsLabel_;
    QLineEdit *newTokenEdit_;
    QCheckBox *sameUserCheck_;
    QPushButton *connectButton_;
    QPushButton *disconnectButton_;
    QWidget *staleBox_;
};
