#include "faultpanel.h"

#include "faultclient.h"
#include "faultproxy.h"

#include <im/client.h>
#include <im/testing.h>

#include <QtCore/QFile>
#include <QtWidgets/QCheckBox>
#include <QtWidgets/QComboBox>
#include <QtWidgets/QFormLayout>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QLabel>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QSpinBox>

FaultPanel::FaultPanel(const Session &session, im::Client *client, im::testing::Faults *faults, QWidget *parent)
    : QGroupBox(tr("Faults"), parent), session_(session), client_(client), faults_(faults),
      labClient_(new FaultClient(this)) {
    setObjectName(QStringLiteral("faultPanel"));
    offlineButton_ = new QPushButton(tr("Go offline"));
    offlineButton_->setObjectName(QStringLiteral("offlineButton"));
    offlineButton_->setCheckable(true);
    connect(offlineButton_, &QPushButton::toggled, faults_, &im::testing::Faults::setOffline);
    connect(faults_, &im::testing::Faults::offlineChanged, this, [this](bool off) {
        const QSignalBlocker block(offlineButton_);
        offlineButton_->setChecked(off);
        offlineButton_->setText(off ? tr("Go online") : tr("Go offline"));
    });
    auto *drop = new QPushButton(tr("Drop next reply"));
    drop->setObjectName(QStringLiteral("dropReplyButton"));
    drop->setToolTip(tr("The client ignores the next reply frame: the request times out and is resent with the same cmid"));
    connect(drop, &QPushButton::clicked, this, [this] {
        faults_->dropNextReply();
        emit statusMessage(tr("The next reply will be dropped"), 5000);
    });
    connect(faults_, &im::testing::Faults::replyDropped, this, [this](const QString &rid, const QString &type) {
        emit statusMessage(tr("Dropped the reply to %1 (%2)").arg(rid, type), 10000);
    });
    auto *closeNow = new QPushButton(tr("Close socket now"));
    closeNow->setObjectName(QStringLiteral("closeSocketButton"));
    connect(closeNow, &QPushButton::clicked, faults_, &im::testing::Faults::closeSocketNow);

    timeoutSpin_ = new QSpinBox;
    timeoutSpin_->setObjectName(QStringLiteral("timeoutSpin"));
    timeoutSpin_->setRange(200, 120000);
    timeoutSpin_->setSingleStep(500);
    timeoutSpin_->setSuffix(QStringLiteral(" ms"));
    timeoutSpin_->setValue(client_->requestTimeout());
    connect(timeoutSpin_, &QSpinBox::valueChanged, client_, &im::Client::setRequestTimeout);

    auto *burst = new QPushButton(tr("Send a burst"));
    burst->setObjectName(QStringLiteral("burstButton"));
    burst->setToolTip(tr("Sends 80 messages at once to this conversation: past the server's --send-burst (60) "
                         "some are answered RATE_LIMITED; the outbox shows them waiting the server's retry_ms, "
                         "then they are sent with the same cmid"));
    connect(burst, &QPushButton::clicked, this, [this] { emit burstRequested(80); });

    auto *clientRow = new QHBoxLayout;
    clientRow->addWidget(offlineButton_);
    clientRow->addWidget(drop);
    clientRow->addWidget(closeNow);
    clientRow->addWidget(burst);

    // Files (obligation 17; docs/demo-app.md "Files: QA controls"). The
    // throttle is in the client settings; "Close socket now" above kills
    // the connection mid-upload.
    auto *corrupt = new QPushButton(tr("Corrupt next chunk"));
    corrupt->setObjectName(QStringLiteral("corruptChunkButton"));
    corrupt->setToolTip(tr("One byte of the next upload request (PUT) is flipped on the wire; the store's copy stays "
                           "intact. The server answers 422 DIGEST_MISMATCH at the last byte, the SDK starts the "
                           "upload again at 0 and the message goes once (log pane: DIGEST_MISMATCH)"));
    connect(corrupt, &QPushButton::clicked, this, [this] {
        faults_->corruptNextUploadChunk();
        emit statusMessage(tr("The next upload chunk will have one byte flipped on the way"), 10000);
    });
    connect(faults_, &im::testing::Faults::uploadChunkCorrupted, this, [this](const QString &cmid, qint64 offset) {
        emit statusMessage(tr("Flipped a byte of the chunk at %1 of %2: expect 422 DIGEST_MISMATCH and a restart at 0")
                               .arg(offset)
                               .arg(cmid.left(8)),
                           15000);
    });
    auto *damage = new QPushButton(tr("Damage the store's copy"));
    damage->setObjectName(QStringLiteral("damageCopyButton"));
    damage->setToolTip(tr("Flips the last byte of the store's copy of the oldest file still uploading: what the user "
                          "attached no longer exists intact, so the server's 422 DIGEST_MISMATCH is final and the "
                          "message shows Failed: DIGEST_MISMATCH (its upload removed from the server)"));
    connect(damage, &QPushButton::clicked, this, &FaultPanel::damageStoreCopy);
    auto *restart = new QPushButton(tr("Restart this window"));
    restart->setObjectName(QStringLiteral("restartWindowButton"));
    restart->setToolTip(tr("Closes this window's client and store as a quit app would, and opens the window again on "
                           "the same store: the outbox (an upload too) goes on from where the server stands"));
    connect(restart, &QPushButton::clicked, this, &FaultPanel::restartRequested);
    auto *fileRow = new QHBoxLayout;
    fileRow->addWidget(corrupt);
    fileRow->addWidget(damage);
    fileRow->addWidget(restart);

    faultPoint_ = new QComboBox;
    faultPoint_->setObjectName(QStringLiteral("faultPoint"));
    faultPoint_->setEditable(true);
    faultPoint_->addItems({QStringLiteral("api.after_send_commit"), QStringLiteral("store.before_insert"),
                           QStringLiteral("store.before_commit")});
    faultAction_ = new QComboBox;
    faultAction_->setObjectName(QStringLiteral("faultAction"));
    faultAction_->setEditable(true);
    faultAction_->addItems({QStringLiteral("drop_reply"), QStringLiteral("unavailable"), QStringLiteral("delay:3000"),
                            QStringLiteral("crash")});
    faultCount_ = new QSpinBox;
    faultCount_->setObjectName(QStringLiteral("faultCount"));
    faultCount_->setRange(0, 1000);
    faultCount_->setValue(1);
    faultCount_->setSpecialValueText(tr("until off"));
    faultCount_->setPrefix(QStringLiteral("x "));
    auto *arm = new QPushButton(tr("Arm"));
    arm->setObjectName(QStringLiteral("armFaultButton"));
    connect(arm, &QPushButton::clicked, this, [this] { armServerFault(false); });
    auto *off = new QPushButton(tr("All off"));
    off->setObjectName(QStringLiteral("clearFaultsButton"));
    connect(off, &QPushButton::clicked, this, [this] { armServerFault(true); });
    auto *armRow = new QHBoxLayout;
    armRow->addWidget(faultCount_);
    armRow->addWidget(arm);
    armRow->addWidget(off);

    faultAnswer_ = new QLabel(tr("(no server fault armed from this window)"));
    faultAnswer_->setObjectName(QStringLiteral("faultAnswer"));
    faultAnswer_->setWordWrap(true);
    faultAnswer_->setTextInteractionFlags(Qt::TextSelectableByMouse);
    labUrlLabel_ = new QLabel;
    labUrlLabel_->setObjectName(QStringLiteral("labUrlLabel"));
    labUrlLabel_->setStyleSheet(QStringLiteral("color: gray"));
    labUrlLabel_->setWordWrap(true);
    connect(labClient_, &FaultClient::answered, this, [this](int status, const QString &text) {
        faultAnswer_->setText(text);
        faultAnswer_->setStyleSheet(status == 200 ? QStringLiteral("color: #006000")
                                                  : QStringLiteral("color: #b00000"));
    });

    auto *form = new QFormLayout;
    form->addRow(clientRow);
    form->addRow(tr("Files:"), fileRow);
    form->addRow(tr("Request timeout:"), timeoutSpin_);
    auto *serverTitle = new QLabel(tr("<b>Server fault point</b> (imserver --enable-faults)"));
    form->addRow(serverTitle);
    form->addRow(tr("Point:"), faultPoint_);
    form->addRow(tr("Action:"), faultAction_);
    form->addRow(tr("Count:"), armRow);
    form->addRow(faultAnswer_);
    form->addRow(labUrlLabel_);
    // Silent server: a proxy in this app between the client and the server.
    routeCheck_ = new QCheckBox(tr("Through the local fault proxy"));
    routeCheck_->setObjectName(QStringLiteral("routeProxyCheck"));
    routeCheck_->setToolTip(tr("Client::setServers() with a proxy on 127.0.0.1 for each server URL, then a "
                               "reconnect through it. wss:// through the proxy fails the host name check "
                               "unless the certificate is pinned."));
    connect(routeCheck_, &QCheckBox::toggled, this, &FaultPanel::setRouted);
    silenceButton_ = new QPushButton(tr("Silence the server"));
    silenceButton_->setObjectName(QStringLiteral("silenceServerButton"));
    silenceButton_->setToolTip(tr("Every connection through the proxy stays open but carries nothing more, either "
                                  "way (no reply, no push, no pong) until the client drops it; new connections "
                                  "pass. The keepalive (Client settings) notices and reconnects."));
    silenceButton_->setEnabled(false);
    connect(silenceButton_, &QPushButton::clicked, this, &FaultPanel::silenceServer);
    auto *silentRow = new QHBoxLayout;
    silentRow->addWidget(routeCheck_, 1);
    silentRow->addWidget(silenceButton_);
    proxyLabel_ = new QLabel(tr("Not routed through the proxy"));
    proxyLabel_->setObjectName(QStringLiteral("proxyLabel"));
    proxyLabel_->setWordWrap(true);
    proxyLabel_->setStyleSheet(QStringLiteral("color: gray"));
    form->addRow(new QLabel(tr("<b>Silent server</b> (local proxy)")));
    form->addRow(silentRow);
    form->addRow(proxyLabel_);
    setLayout(form);
    updateLabUrl();
}

QUrl FaultPanel::labServer() const {
    const QUrl cur = client_->currentServer();
    for (const FaultProxy *p : proxies_)
        if (cur == p->proxiedUrl())
            return p->upstream(); // the lab endpoint is the real server's
    if (cur.isValid() && !cur.host().isEmpty())
        return cur;
    return session_.servers.value(0);
}

void FaultPanel::armServerFault(bool off) {
    const QString body = off ? QStringLiteral("off")
                             : FaultClient::spec(faultPoint_->currentText(), faultAction_->currentText(),
                                                 faultCount_->value());
    faultAnswer_->setText(tr("posting \"%1\"...").arg(body));
    faultAnswer_->setStyleSheet(QString());
    labClient_->post(labServer(), body);
}

void FaultPanel::damageStoreCopy() {
    // The oldest file entry whose upload is not complete (the one uploading,
    // or the next to): its copy is <database>.files/outgoing/<cmid>
    // (docs/sdk.md "Sending files").
    for (const im::OutboxEntry &e : client_->outbox()) {
        const QVariantMap up = client_->uploadState(e.cmid());
        if (up.isEmpty() || up.value(QStringLiteral("complete")).toBool())
            continue;
        const QString path = client_->databasePath() + QStringLiteral(".files/outgoing/") + e.cmid();
        QFile f(path);
        char b = 0;
        if (!f.open(QIODevice::ReadWrite) || f.size() == 0 || !f.seek(f.size() - 1) || !f.getChar(&b)
            || !f.seek(f.size() - 1) || !f.putChar(char(b ^ 0x01))) {
            emit statusMessage(tr("Could not damage %1: %2").arg(path, f.errorString()), 10000);
            return;
        }
        emit statusMessage(tr("Flipped the last byte of %1: expect Failed: DIGEST_MISMATCH").arg(path), 15000);
        return;
    }
    emit statusMessage(tr("No file is uploading: attach one first (slow it down with the upload limit)"), 10000);
}

void FaultPanel::updateLabUrl() {
    labUrlLabel_->setText(tr("Lab endpoint: %1").arg(FaultClient::labUrl(labServer()).toString()));
}

void FaultPanel::setRouted(bool on) {
    if (on == isRouted())
        return;
    if (on) {
        QList<QUrl> proxied;
        for (const QUrl &url : session_.servers) {
            auto *p = new FaultProxy(url, this);
            if (!p->start()) {
                emit statusMessage(tr("Fault proxy: cannot listen: %1").arg(p->errorString()), 10000);
                delete p;
                qDeleteAll(proxies_);
                proxies_.clear();
                const QSignalBlocker block(routeCheck_);
                routeCheck_->setChecked(false);
                return;
            }
            connect(p, &FaultProxy::changed, this, &FaultPanel::updateProxyLabel);
            proxies_ << p;
            proxied << p->proxiedUrl();
        }
        client_->setServers(proxied);
    } else {
        client_->setServers(session_.servers);
    }
    // Reconnect at the new address (the next attempt uses the new list).
    if (client_->connectionState() != im::ConnectionState::Disconnected)
        faults_->closeSocketNow();
    if (!on) {
        qDeleteAll(proxies_);
        proxies_.clear();
    }
    {
        const QSignalBlocker block(routeCheck_);
        routeCheck_->setChecked(on);
    }
    silenceButton_->setEnabled(on);
    updateProxyLabel();
    updateLabUrl();
}

void FaultPanel::silenceServer() {
    int n = 0;
    for (FaultProxy *p : proxies_)
        n += p->silence();
    emit statusMessage(tr("Silenced %1 connection(s): open, but nothing in or out").arg(n), 10000);
}

void FaultPanel::updateProxyLabel() {
    if (proxies_.isEmpty()) {
        proxyLabel_->setText(tr("Not routed through the proxy"));
        return;
    }
    QStringList lines;
    for (const FaultProxy *p : proxies_)
        lines << tr("%1 -> %2:%3: %4 open, %5 silenced, %6 accepted")
                     .arg(p->proxiedUrl().authority(), p->upstream().host())
                     .arg(p->upstream().port())
                     .arg(p->openConnections())
                     .arg(p->silencedConnections())
                     .arg(p->acceptedConnections());
    proxyLabel_->setText(lines.join(QLatin1Char('\n')));
}
