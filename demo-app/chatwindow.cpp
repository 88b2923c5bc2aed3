#include "chatwindow.h"

#include "connectionpanel.h"
#include "conversationpanel.h"
#include "faultpanel.h"
#include "logpanel.h"
#include "searchpanel.h"
#include "settingspanel.h"
#include "typingbar.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>
#include <im/outboxmodel.h>
#include <im/searchmodel.h>
#include <im/testing.h>

#include <QtCore/QTimer>
#include <QtGui/QAction>
#include <QtGui/QKeySequence>
#include <QtWidgets/QLabel>
#include <QtWidgets/QMenu>
#include <QtWidgets/QMenuBar>
#include <QtWidgets/QScrollArea>
#include <QtWidgets/QSplitter>
#include <QtWidgets/QStatusBar>
#include <QtWidgets/QVBoxLayout>

using im::ConnectionState;
using im::ConversationListModel;
using im::MessageListModel;
using im::OutboxModel;

QString ChatWindow::stateText(im::MessageState state, const QString &errorCode) {
    return MessagePanel::stateText(state, errorCode);
}

ChatWindow::ChatWindow(const Session &session, QWidget *parent)
    : QMainWindow(parent), session_(session), client_(new im::Client(this)),
      clientFaults_(new im::testing::Faults(client_, this)), tick_(new QTimer(this)) {
    setAttribute(Qt::WA_DeleteOnClose);
    setObjectName(QStringLiteral("chatWindow"));
    // The log pane first: it shows what the SDK logs from here on.
    logPanel_ = new LogPanel;
    client_->setServers(session.servers);
    client_->setCredentials(session.token);
    // TLS settings the client refuses (unreadable CA, malformed pin) keep
    // the window offline: connecting with weaker trust than asked is wrong.
    QString tlsProblem;
    if (!session.caFile.isEmpty() && !client_->setTrustedCaFile(session.caFile))
        tlsProblem = client_->lastError();
    if (tlsProblem.isEmpty() && !session.pinSha256.isEmpty() && !client_->setPinnedCertificateSha256(session.pinSha256))
        tlsProblem = client_->lastError();
    const bool opened = client_->open(session.dbPath);

    convs_ = new ConversationListModel(client_, this);
    msgs_ = new MessageListModel(client_, QString(), this);
    outbox_ = new OutboxModel(client_, this);

    convPanel_ = new ConversationPanel(convs_);
    messagePanel_ = new MessagePanel(client_, msgs_, convs_);
    TypingBar::attach(messagePanel_, client_, msgs_); // "ana is typing…" under the timeline, setTyping from the send box
    connPanel_ = new ConnectionPanel(session_, client_, clientFaults_);
    faultPanel_ = new FaultPanel(session_, client_, clientFaults_);
    settingsPanel_ = new SettingsPanel(client_);
    outboxPanel_ = new OutboxPanel(client_, outbox_);
    searchPanel_ = new SearchPanel(client_);

    auto *top = new QSplitter(Qt::Horizontal);
    top->setObjectName(QStringLiteral("topSplitter"));
    // Conversations above, the search box below them.
    auto *left = new QSplitter(Qt::Vertical);
    left->setObjectName(QStringLiteral("leftSplitter"));
    left->addWidget(convPanel_);
    left->addWidget(searchPanel_);
    left->setSizes({300, 340});
    top->addWidget(left);
    top->addWidget(messagePanel_);
    auto *right = new QWidget;
    auto *rightLayout = new QVBoxLayout(right);
    rightLayout->setContentsMargins(0, 0, 0, 0);
    rightLayout->addWidget(connPanel_);
    rightLayout->addWidget(faultPanel_);
    rightLayout->addWidget(settingsPanel_);
    rightLayout->addStretch(1);
    auto *rightScroll = new QScrollArea;
    rightScroll->setObjectName(QStringLiteral("rightPanels"));
    rightScroll->setWidget(right);
    rightScroll->setWidgetResizable(true);
    rightScroll->setFrameShape(QFrame::NoFrame);
    rightScroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    top->addWidget(rightScroll);
    top->setStretchFactor(0, 0);
    top->setStretchFactor(1, 1);
    top->setStretchFactor(2, 0);
    top->setSizes({300, 670, 410});

    auto *bottom = new QSplitter(Qt::Horizontal);
    bottom->setObjectName(QStringLiteral("bottomSplitter"));
    bottom->addWidget(outboxPanel_);
    bottom->addWidget(logPanel_);
    bottom->setSizes({880, 500});

    auto *main = new QSplitter(Qt::Vertical);
    main->setObjectName(QStringLiteral("mainSplitter"));
    main->addWidget(top);
    main->addWidget(bottom);
    main->setStretchFactor(0, 1);
    main->setStretchFactor(1, 0);
    main->setSizes({640, 220});
    setCentralWidget(main);
    buildMenus();

    statusConn_ = new QLabel;
    statusConn_->setObjectName(QStringLiteral("statusConnection"));
    statusBar()->addPermanentWidget(statusConn_);

    connect(messagePanel_, &MessagePanel::statusMessage, this, &ChatWindow::showStatus);
    connect(connPanel_, &ConnectionPanel::statusMessage, this, &ChatWindow::showStatus);
    connect(faultPanel_, &FaultPanel::statusMessage, this, &ChatWindow::showStatus);
    connect(faultPanel_, &FaultPanel::restartRequested, this, &ChatWindow::restartRequested);
    connect(faultPanel_, &FaultPanel::burstRequested, this, [this](int count) {
        if (currentConv_.isEmpty()) {
            showStatus(tr("Pick a conversation first"), 5000);
            return;
        }
        for (int i = 1; i <= count; ++i)
            client_->send(currentConv_, tr("burst %1/%2").arg(i).arg(count));
        showStatus(tr("Sent a burst of %1: past the server's rate some wait as RATE_LIMITED (Outbox: last error, "
                      "next retry), then go out with the same cmid")
                       .arg(count),
                   15000);
    });
    connect(outboxPanel_, &OutboxPanel::statusMessage, this, &ChatWindow::showStatus);
    connect(messagePanel_, &MessagePanel::actionDone, this, &ChatWindow::recordAction);
    connect(outboxPanel_, &OutboxPanel::actionDone, this, &ChatWindow::recordAction);
    connect(convPanel_, &ConversationPanel::conversationActivated, this, &ChatWindow::selectConversation);
    connect(searchPanel_, &SearchPanel::resultActivated, this, [this](const QString &conv, qint64 seq) {
        selectConversation(conv);
        messagePanel_->showMessage(seq);
    });
    connect(convPanel_, &ConversationPanel::listChanged, this, &ChatWindow::reselectConversation);
    connect(convPanel_, &ConversationPanel::markersChanged, messagePanel_, &MessagePanel::updateHeader);
    connect(client_, &im::Client::conversationsChanged, messagePanel_, &MessagePanel::updateHeader);

    tick_->setInterval(250);
    connect(tick_, &QTimer::timeout, this, [this] {
        connPanel_->tick();
        outboxPanel_->tick();
        if (client_->connectionState() == ConnectionState::Reconnecting)
            statusConn_->setText(connPanel_->connectionText());
    });
    tick_->start();

    connect(client_, &im::Client::connectionStateChanged, this, &ChatWindow::updateConnection);
    connect(clientFaults_, &im::testing::Faults::offlineChanged, this, &ChatWindow::updateConnection);
    connect(client_, &im::Client::identityChanged, this, &ChatWindow::updateTitle);
    connect(client_, &im::Client::installStaleChanged, this, &ChatWindow::updateConnection);

    if (!opened) {
        connPanel_->setError(QStringLiteral("Cannot open %1: %2").arg(session.dbPath, client_->lastError()));
        messagePanel_->setSendEnabled(false);
    } else if (!tlsProblem.isEmpty()) {
        connPanel_->setError(QStringLiteral("TLS settings refused, not connecting: ") + tlsProblem);
    }
    updateConnection();
    reselectConversation();
    resize(1380, 860);
    if (opened && tlsProblem.isEmpty())
        client_->connectToServer();
}

QString ChatWindow::tlsText() const { return ConnectionPanel::tlsText(session_); }

QString ChatWindow::connectionText() const { return connPanel_->connectionText(); }

ChatWindow::~ChatWindow() {
    // Nothing of this half-destroyed window may react to the client any more.
    tick_->stop();
    disconnect(client_, nullptr, this, nullptr);
    for (QObject *panel : std::initializer_list<QObject *>{convPanel_, messagePanel_, connPanel_, faultPanel_,
                                                           settingsPanel_, outboxPanel_})
        disconnect(client_, nullptr, panel, nullptr);
    // Models first: they watch the client.
    searchPanel_->model()->setClient(nullptr);
    delete msgs_;
    delete convs_;
    delete outbox_;
    msgs_ = nullptr;
    convs_ = nullptr;
    outbox_ = nullptr;
    client_->close();
}

void ChatWindow::buildMenus() {
    QMenu *file = menuBar()->addMenu(tr("&Window"));
    QAction *another = file->addAction(tr("Open another window (user or device)..."));
    another->setObjectName(QStringLiteral("openAnotherAction"));
    another->setShortcut(QKeySequence::New);
    connect(another, &QAction::triggered, this, &ChatWindow::openAnotherRequested);
    QAction *close = file->addAction(tr("Close this window"));
    close->setShortcut(QKeySequence::Close);
    connect(close, &QAction::triggered, this, &QWidget::close);
}

void ChatWindow::selectConversation(const QString &conv) {
    currentConv_ = conv;
    messagePanel_->setConversation(conv);
    convPanel_->showCurrent(conv);
    searchPanel_->setCurrentConversation(conv);
}

void ChatWindow::reselectConversation() {
    if (currentConv_.isEmpty()) {
        if (convs_->rowCount() > 0)
            selectConversation(convs_->get(0, ConversationListModel::ConvRole).toString());
        return;
    }
    selectConversation(currentConv_);
}

void ChatWindow::updateConnection() {
    statusConn_->setText(connPanel_->connectionText());
    faultPanel_->updateLabUrl();
    updateTitle();
}

void ChatWindow::updateTitle() {
    const QString user = client_->userId().isEmpty() ? session_.user : client_->userId();
    const QString device = client_->deviceId().isEmpty() ? session_.device : client_->deviceId();
    setWindowTitle(QStringLiteral("imdemo - %1 (%2)%3")
                       .arg(user.isEmpty() ? session_.label() : user, device.isEmpty() ? QStringLiteral("?") : device,
                            client_->gatewayId().isEmpty() ? QString() : QStringLiteral(" @ ") + client_->gatewayId()));
}

void ChatWindow::showStatus(const QString &text, int timeoutMs) { statusBar()->showMessage(text, timeoutMs); }

void ChatWindow::recordAction(const QString &text) {
    lastActionText_ = text;
    statusBar()->showMessage(text, 10000);
}
