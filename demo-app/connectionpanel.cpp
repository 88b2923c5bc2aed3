#include "connectionpanel.h"

#include <im/client.h>
#include <im/testing.h>

#include <QtCore/QDateTime>
#include <QtCore/QFileInfo>
#include <QtWidgets/QCheckBox>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QLabel>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QVBoxLayout>

#include <algorithm>

using im::ConnectionState;

// "TLS: ..." for the connection panel: which trust the wss:// URLs use. With
// a CA file the SDK checks the server against that file's CAs ONLY
// (Client::setTrustedCaFile replaces the system store: QSslConfiguration::
// setCaCertificates), so the panel says "only", never "system store +".
QString ConnectionPanel::tlsText(const Session &session) {
    const bool wss = std::any_of(session.servers.begin(), session.servers.end(),
                                 [](const QUrl &u) { return u.scheme() == QLatin1String("wss"); });
    if (!wss)
        return tr("TLS: off (ws://)");
    QString trust = session.caFile.isEmpty()
                        ? tr("system trust store")
                        : tr("only CA %1 (instead of the system store)").arg(QFileInfo(session.caFile).fileName());
    if (!session.pinSha256.isEmpty())
        trust += tr(", pinned SHA-256 %1...").arg(session.pinSha256.left(11));
    return tr("TLS: wss:// with %1").arg(trust);
}

ConnectionPanel::ConnectionPanel(const Session &session, im::Client *client, im::testing::Faults *faults,
                                 QWidget *parent)
    : QGroupBox(tr("Connection"), parent), session_(session), client_(client), faults_(faults) {
    setObjectName(QStringLiteral("connectionPanel"));
    connLabel_ = new QLabel;
    connLabel_->setObjectName(QStringLiteral("connectionLabel"));
    connLabel_->setTextFormat(Qt::RichText);
    connLabel_->setWordWrap(true);
    identityLabel_ = new QLabel;
    identityLabel_->setObjectName(QStringLiteral("identityLabel"));
    identityLabel_->setWordWrap(true);
    identityLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
    auto *tlsLabel = new QLabel(tlsText(session_));
    tlsLabel->setObjectName(QStringLiteral("tlsLabel"));
    tlsLabel->setWordWrap(true);
    errorLabel_ = new QLabel;
    errorLabel_->setObjectName(QStringLiteral("errorLabel"));
    errorLabel_->setWordWrap(true);
    errorLabel_->setStyleSheet(QStringLiteral("color: #b00000"));

    // Credentials (obligation 14): when the token runs out, what the client
    // asked for, and a way to hand over a new one (setCredentials: a JWT is
    // swapped in on the open connection with `refresh`; after a rejection
    // the client reconnects with it).
    tokenExpiryLabel_ = new QLabel;
    tokenExpiryLabel_->setObjectName(QStringLiteral("tokenExpiryLabel"));
    credentialsLabel_ = new QLabel(tr("Credentials: no request from the client"));
    credentialsLabel_->setObjectName(QStringLiteral("credentialsLabel"));
    credentialsLabel_->setWordWrap(true);
    newTokenEdit_ = new QLineEdit;
    newTokenEdit_->setObjectName(QStringLiteral("newTokenEdit"));
    newTokenEdit_->setPlaceholderText(tr("paste a new token (device token or JWT)"));
    newTokenEdit_->setEchoMode(QLineEdit::PasswordEchoOnEdit);
    auto *useToken = new QPushButton(tr("Use token"));
    useToken->setObjectName(QStringLiteral("useTokenButton"));
    useToken->setToolTip(tr("Client::setCredentials(): used for the next hello; a JWT is also sent as "
                            "`refresh` on the open connection"));
    auto handOver = [this] {
        const QString token = newTokenEdit_->text().trimmed();
        if (token.isEmpty())
            return;
        const bool connected = client_->connectionState() == ConnectionState::Connected;
        // Said first: setCredentials() may ask again at once (a JWT close to its exp).
        credentialsLabel_->setText(connected ? tr("Credentials: new token handed over on the open connection")
                                             : tr("Credentials: new token handed over, used for the next hello"));
        credentialsLabel_->setStyleSheet(QString());
        newTokenEdit_->clear();
        // Obligation 10: only when the tester says it is the same person do
        // the previous token's held drafts go with the new one.
        client_->setCredentials(token, sameUserCheck_->isChecked() ? im::Client::SameUser : im::Client::UnknownUser);
        sameUserCheck_->setChecked(false);
        updateTokenExpiry();
    };
    connect(useToken, &QPushButton::clicked, this, handOver);
    connect(newTokenEdit_, &QLineEdit::returnPressed, this, handOver);
    connect(client_, &im::Client::credentialsNeeded, this, [this](im::Client::CredentialsReason reason) {
        credentialsLabel_->setText(reason == im::Client::CredentialsReason::Expiring
                                       ? tr("Credentials needed: the token expires soon (paste a new one)")
                                       : tr("Credentials needed: the server rejected the token; not reconnecting "
                                            "until a new one is pasted"));
        credentialsLabel_->setStyleSheet(QStringLiteral("color: #b00000"));
    });
    connect(client_, &im::Client::awaitingCredentialsChanged, this, [this](bool waiting) {
        if (!waiting)
            credentialsLabel_->setStyleSheet(QString());
        updateTokenExpiry();
    });
    connect(client_, &im::Client::tokenExpiresAtChanged, this, &ConnectionPanel::updateTokenExpiry);
    sameUserCheck_ = new QCheckBox(tr("Same person"));
    sameUserCheck_->setObjectName(QStringLiteral("sameUserCheck"));
    sameUserCheck_->setToolTip(tr("setCredentials(token, im::Client::SameUser): the new token is the same person's, "
                                  "so drafts written under the previous token that no welcome proved go with it. "
                                  "Unticked, they stay held (never sent as someone else)."));
    auto *tokenRow = new QHBoxLayout;
    tokenRow->addWidget(newTokenEdit_, 1);
    tokenRow->addWidget(sameUserCheck_);
    tokenRow->addWidget(useToken);

    staleBox_ = new QWidget;
    auto *staleRow = new QHBoxLayout(staleBox_);
    staleRow->setContentsMargins(0, 0, 0, 0);
    auto *staleText = new QLabel(tr("STALE_INSTALL: a newer install of this device exists."));
    staleText->setWordWrap(true);
    staleText->setStyleSheet(QStringLiteral("color: #b00000; font-weight: bold"));
    auto *reset = new QPushButton(tr("Reset install"));
    reset->setObjectName(QStringLiteral("resetInstallButton"));
    connect(reset, &QPushButton::clicked, this, [this] {
        if (!client_->resetInstall())
            errorLabel_->setText(QStringLiteral("Reset failed: %1").arg(client_->lastError()));
    });
    staleRow->addWidget(staleText, 1);
    staleRow->addWidget(reset);

    // Connect / Disconnect (issue 48): after "Reset install", a refusal
    // (WRONG_USER, STALE_INSTALL) or a disconnect, the client stays
    // Disconnected until the app connects it again; QA does it here instead
    // of closing the window.
    connectButton_ = new QPushButton(tr("Connect"));
    connectButton_->setObjectName(QStringLiteral("connectButton"));
    connectButton_->setToolTip(tr("Client::connectToServer(): connect and keep reconnecting"));
    connect(connectButton_, &QPushButton::clicked, client_, &im::Client::connectToServer);
    disconnectButton_ = new QPushButton(tr("Disconnect"));
    disconnectButton_->setObjectName(QStringLiteral("disconnectButton"));
    disconnectButton_->setToolTip(tr("Client::disconnectFromServer(): close the connection and stop reconnecting; "
                                     "what is typed meanwhile waits in the outbox"));
    connect(disconnectButton_, &QPushButton::clicked, client_, &im::Client::disconnectFromServer);
    auto *syncAll = new QPushButton(tr("Sync all"));
    syncAll->setObjectName(QStringLiteral("syncAllButton"));
    connect(syncAll, &QPushButton::clicked, client_, &im::Client::syncAll);
    auto *resend = new QPushButton(tr("Resend pending"));
    resend->setObjectName(QStringLiteral("resendButton"));
    connect(resend, &QPushButton::clicked, client_, &im::Client::resendPending);
    auto *buttons = new QHBoxLayout;
    buttons->addWidget(connectButton_);
    buttons->addWidget(disconnectButton_);
    buttons->addWidget(syncAll);
    buttons->addWidget(resend);

    auto *l = new QVBoxLayout;
    l->addWidget(connLabel_);
    l->addWidget(identityLabel_);
    l->addWidget(tlsLabel);
    l->addWidget(staleBox_);
    l->addWidget(tokenExpiryLabel_);
    l->addWidget(credentialsLabel_);
    l->addLayout(tokenRow);
    l->addWidget(errorLabel_);
    l->addLayout(buttons);
    setLayout(l);

    connect(client_, &im::Client::connectionStateChanged, this, &ConnectionPanel::updateConnection);
    connect(faults_, &im::testing::Faults::offlineChanged, this, &ConnectionPanel::updateConnection);
    connect(client_, &im::Client::identityChanged, this, &ConnectionPanel::updateIdentity);
    connect(client_, &im::Client::installIdChanged, this, &ConnectionPanel::updateIdentity);
    connect(client_, &im::Client::installStaleChanged, this, [this](bool stale) {
        staleBox_->setVisible(stale);
        updateConnection();
    });
    connect(client_, &im::Client::errorOccurred, this, [this](const QString &code, const QString &msg) {
        const QString text = QStringLiteral("%1  %2: %3")
                                 .arg(QTime::currentTime().toString(QStringLiteral("HH:mm:ss")), code, msg);
        errorLabel_->setText(QStringLiteral("Last error: ") + text);
        emit statusMessage(text, 10000);
    });
    staleBox_->setVisible(client_->isInstallStale());
    updateTokenExpiry();
    updateConnection();
}

QString ConnectionPanel::connectionText() const {
    const QString url = client_->currentServer().toString();
    switch (client_->connectionState()) {
    case ConnectionState::Disconnected:
        if (client_->isInstallStale())
            return QStringLiteral("Disconnected (stale install)");
        return faults_->isOffline() ? QStringLiteral("Offline (simulated)") : QStringLiteral("Disconnected");
    case ConnectionState::Connecting: return QStringLiteral("Connecting to %1").arg(url);
    case ConnectionState::Connected:
        return QStringLiteral("Connected - gateway %1 - %2").arg(client_->gatewayId(), url);
    case ConnectionState::Reconnecting: {
        const QDateTime at = client_->nextReconnectAt();
        const qint64 ms = at.isValid() ? qMax<qint64>(0, QDateTime::currentDateTimeUtc().msecsTo(at)) : 0;
        return QStringLiteral("Reconnecting in %1 s (%2)").arg(double(ms) / 1000.0, 0, 'f', 1).arg(url);
    }
    }
    return {};
}

void ConnectionPanel::updateConnection() {
    QString color;
    switch (client_->connectionState()) {
    case ConnectionState::Disconnected: color = QStringLiteral("#808080"); break;
    case ConnectionState::Connecting: color = QStringLiteral("#d08000"); break;
    case ConnectionState::Connected: color = QStringLiteral("#00a000"); break;
    case ConnectionState::Reconnecting: color = QStringLiteral("#d00000"); break;
    }
    // Connect while nothing runs (not for a stale install: Reset it first);
    // Disconnect while the client is connected or trying to be.
    const bool idle = client_->connectionState() == ConnectionState::Disconnected;
    connectButton_->setEnabled(idle && !client_->isInstallStale());
    disconnectButton_->setEnabled(!idle);
    const QString text = connectionText();
    connLabel_->setText(QStringLiteral("<span style='color:%1; font-size:16pt'>&#9679;</span> <b>%2</b>")
                            .arg(color, text.toHtmlEscaped()));
    updateIdentity();
}

void ConnectionPanel::updateIdentity() {
    const QString user = client_->userId().isEmpty() ? session_.user : client_->userId();
    const QString device = client_->deviceId().isEmpty() ? session_.device : client_->deviceId();
    QStringList servers;
    for (const QUrl &u : client_->servers())
        servers << u.toString();
    identityLabel_->setText(tr("User %1, device %2\nInstall %3\nDatabase %4\nServers %5")
                                .arg(user.isEmpty() ? tr("(unknown until welcome)") : user,
                                     device.isEmpty() ? QStringLiteral("-") : device, client_->installId(),
                                     client_->databasePath(), servers.join(QStringLiteral(", "))));
}

void ConnectionPanel::updateTokenExpiry() {
    QString text;
    const QDateTime at = client_->tokenExpiresAt();
    if (client_->isAwaitingCredentials())
        text = tr("Token rejected: paste a new one");
    else if (!at.isValid())
        text = tr("Token expiry unknown (not a JWT, no token_expiring yet)");
    else if (const qint64 left = QDateTime::currentDateTimeUtc().secsTo(at); left >= 0)
        text = tr("Token expires in %1 s").arg(left);
    else
        text = tr("Token expired %1 s ago").arg(-left);
    if (tokenExpiryLabel_->text() != text)
        tokenExpiryLabel_->setText(text);
}

void ConnectionPanel::setError(const QString &text) { errorLabel_->setText(text); }

void ConnectionPanel::tick() {
    if (client_->connectionState() == ConnectionState::Reconnecting)
        updateConnection();
    updateTokenExpiry();
}
