#include "chatwindow.h"

#include "faultclient.h"
#include "roletablemodel.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>
#include <im/outboxmodel.h>
#include <im/testing.h>

#include <QtCore/QFileInfo>
#include <QtCore/QTimer>
#include <QtGui/QAction>
#include <QtGui/QClipboard>
#include <QtGui/QFont>
#include <QtGui/QGuiApplication>
#include <QtGui/QKeySequence>
#include <QtWidgets/QComboBox>
#include <QtWidgets/QFormLayout>
#include <QtWidgets/QGroupBox>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QHeaderView>
#include <QtWidgets/QLabel>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QMenu>
#include <QtWidgets/QMenuBar>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QScrollBar>
#include <QtWidgets/QSpinBox>
#include <QtWidgets/QSplitter>
#include <QtWidgets/QStatusBar>
#include <QtWidgets/QTableView>
#include <QtWidgets/QVBoxLayout>

#include <algorithm>

using im::ConnectionState;
using im::ConversationListModel;
using im::MessageListModel;
using im::MessageState;
using im::OutboxModel;

namespace {

QColor stateColor(MessageState s) {
    switch (s) {
    case MessageState::Pending: return QColor(0xff, 0xf1, 0xb8);
    case MessageState::Sent: return QColor(0xdc, 0xf3, 0xdf);
    case MessageState::Failed: return QColor(0xff, 0xd0, 0xd0);
    case MessageState::Expired: return QColor(0xe4, 0xdc, 0xf5);
    case MessageState::Recalled: return QColor(0xe2, 0xe2, 0xe2);
    }
    return {};
}

QString relative(const QDateTime &when) {
    if (!when.isValid())
        return QStringLiteral("-");
    const qint64 ms = QDateTime::currentDateTimeUtc().msecsTo(when);
    if (ms <= 0)
        return QStringLiteral("now");
    return QStringLiteral("in %1 s").arg(double(ms) / 1000.0, 0, 'f', 1);
}

QTableView *makeTable(const QString &name) {
    auto *v = new QTableView;
    v->setObjectName(name);
    v->setSelectionBehavior(QAbstractItemView::SelectRows);
    v->setSelectionMode(QAbstractItemView::SingleSelection);
    v->setEditTriggers(QAbstractItemView::NoEditTriggers);
    v->setWordWrap(false);
    v->verticalHeader()->setVisible(false);
    v->verticalHeader()->setDefaultSectionSize(v->fontMetrics().height() + 8);
    v->horizontalHeader()->setHighlightSections(false);
    return v;
}

QGroupBox *group(const QString &title, const QString &name, QLayout *layout) {
    auto *g = new QGroupBox(title);
    g->setObjectName(name);
    g->setLayout(layout);
    return g;
}

} // namespace

QString ChatWindow::stateText(MessageState state, const QString &errorCode) {
    switch (state) {
    case MessageState::Pending: return QStringLiteral("Pending");
    case MessageState::Sent: return QStringLiteral("Sent");
    case MessageState::Failed:
        return errorCode.isEmpty() ? QStringLiteral("Failed") : QStringLiteral("Failed: %1").arg(errorCode);
    case MessageState::Expired:
        return QStringLiteral("Expired: %1").arg(errorCode.isEmpty() ? QStringLiteral("ORIGINAL_EXPIRED") : errorCode);
    case MessageState::Recalled: return QStringLiteral("Recalled");
    }
    return {};
}

ChatWindow::ChatWindow(const Session &session, QWidget *parent)
    : QMainWindow(parent), session_(session), client_(new im::Client(this)),
      clientFaults_(new im::testing::Faults(client_, this)), faults_(new FaultClient(this)),
      tick_(new QTimer(this)), readTimer_(new QTimer(this)) {
    setAttribute(Qt::WA_DeleteOnClose);
    setObjectName(QStringLiteral("chatWindow"));
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

    auto *top = new QSplitter(Qt::Horizontal);
    top->setObjectName(QStringLiteral("topSplitter"));
    top->addWidget(buildConversationPanel());
    top->addWidget(buildMessagePanel());
    auto *right = new QWidget;
    auto *rightLayout = new QVBoxLayout(right);
    rightLayout->setContentsMargins(0, 0, 0, 0);
    rightLayout->addWidget(buildConnectionPanel());
    rightLayout->addWidget(buildFaultPanel());
    rightLayout->addStretch(1);
    top->addWidget(right);
    top->setStretchFactor(0, 0);
    top->setStretchFactor(1, 1);
    top->setStretchFactor(2, 0);
    top->setSizes({250, 700, 400});

    auto *main = new QSplitter(Qt::Vertical);
    main->setObjectName(QStringLiteral("mainSplitter"));
    main->addWidget(top);
    main->addWidget(buildOutboxPanel());
    main->setStretchFactor(0, 1);
    main->setStretchFactor(1, 0);
    main->setSizes({600, 200});
    setCentralWidget(main);
    buildMenus();

    statusConn_ = new QLabel;
    statusConn_->setObjectName(QStringLiteral("statusConnection"));
    statusBar()->addPermanentWidget(statusConn_);

    readTimer_->setSingleShot(true);
    readTimer_->setInterval(150);
    connect(readTimer_, &QTimer::timeout, this, &ChatWindow::advanceReadMarker);

    tick_->setInterval(250);
    connect(tick_, &QTimer::timeout, this, [this] {
        if (client_->connectionState() == ConnectionState::Reconnecting)
            updateConnection();
        if (outbox_->depth() > 0)
            outboxTable_->refreshColumn(ONextRetry);
        updateTokenExpiry();
    });
    tick_->start();

    connect(client_, &im::Client::connectionStateChanged, this, &ChatWindow::updateConnection);
    connect(clientFaults_, &im::testing::Faults::offlineChanged, this, &ChatWindow::updateConnection);
    connect(client_, &im::Client::identityChanged, this, &ChatWindow::updateIdentity);
    connect(client_, &im::Client::installIdChanged, this, &ChatWindow::updateIdentity);
    connect(client_, &im::Client::installStaleChanged, this, [this](bool stale) {
        staleBox_->setVisible(stale);
        updateConnection();
    });
    connect(client_, &im::Client::outboxChanged, this, &ChatWindow::updateOutboxDepth);
    connect(client_, &im::Client::conversationsChanged, this, &ChatWindow::updateConversationHeader);
    connect(client_, &im::Client::errorOccurred, this, [this](const QString &code, const QString &msg) {
        const QString text = QStringLiteral("%1  %2: %3")
                                 .arg(QTime::currentTime().toString(QStringLiteral("HH:mm:ss")), code, msg);
        errorLabel_->setText(QStringLiteral("Last error: ") + text);
        statusBar()->showMessage(text, 10000);
    });
    connect(client_, &im::Client::messageStateChanged, this,
            [this](const QString &conv, const QString &cmid, qint64 seq, MessageState st, const QString &code) {
                if (!recallCmids_.contains(cmid) || st == MessageState::Pending)
                    return;
                recallCmids_.remove(cmid);
                statusBar()->showMessage(QStringLiteral("Recall in %1 (request %2): %3%4")
                                             .arg(conv, cmid.left(8), stateText(st, code),
                                                  seq > 0 ? QStringLiteral(", recall event seq %1").arg(seq)
                                                          : QString()),
                                         15000);
            });

    if (!opened) {
        errorLabel_->setText(QStringLiteral("Cannot open %1: %2").arg(session.dbPath, client_->lastError()));
        sendButton_->setEnabled(false);
        sendEdit_->setEnabled(false);
    } else if (!tlsProblem.isEmpty()) {
        errorLabel_->setText(QStringLiteral("TLS settings refused, not connecting: ") + tlsProblem);
    }
    staleBox_->setVisible(client_->isInstallStale());
    updateIdentity();
    updateTokenExpiry();
    updateConnection();
    updateOutboxDepth();
    reselectConversation();
    updateHistoryControls();
    resize(1380, 860);
    if (opened && tlsProblem.isEmpty())
        client_->connectToServer();
}

// "TLS: ..." for the connection panel: which trust the wss:// URLs use.
QString ChatWindow::tlsText() const {
    const bool wss = std::any_of(session_.servers.begin(), session_.servers.end(),
                                 [](const QUrl &u) { return u.scheme() == QLatin1String("wss"); });
    if (!wss)
        return tr("TLS: off (ws://)");
    QString trust = session_.caFile.isEmpty()
                        ? tr("system trust store")
                        : tr("system store + CA %1").arg(QFileInfo(session_.caFile).fileName());
    if (!session_.pinSha256.isEmpty())
        trust += tr(", pinned SHA-256 %1...").arg(session_.pinSha256.left(11));
    return tr("TLS: wss:// with %1").arg(trust);
}

ChatWindow::~ChatWindow() {
    // Nothing of this half-destroyed window may react to the client any more.
    tick_->stop();
    readTimer_->stop();
    disconnect(client_, nullptr, this, nullptr);
    // Models first: they watch the client.
    delete msgs_;
    delete convs_;
    delete outbox_;
    msgs_ = nullptr;
    convs_ = nullptr;
    outbox_ = nullptr;
    client_->close();
}

// --- panels -----------------------------------------------------------------

QWidget *ChatWindow::buildConversationPanel() {
    convTable_ = new RoleTableModel(
        convs_,
        {{tr("Conversation"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole) {
                  QString t = s.data(ConversationListModel::ConvRole).toString();
                  if (s.data(ConversationListModel::HasGapRole).toBool())
                      t += QStringLiteral(" (gap)");
                  return t;
              }
              if (role == Qt::ToolTipRole)
                  return QStringLiteral("%1, epoch %2, cursor %3, delivered %4")
                      .arg(s.data(ConversationListModel::KindRole).toString())
                      .arg(s.data(ConversationListModel::EpochRole).toLongLong())
                      .arg(s.data(ConversationListModel::CursorRole).toLongLong())
                      .arg(s.data(ConversationListModel::DeliveredRole).toLongLong());
              if (role == Qt::FontRole && s.data(ConversationListModel::UnreadRole).toLongLong() > 0) {
                  QFont f;
                  f.setBold(true);
                  return f;
              }
              return {};
          }},
         {tr("Unread"),
          [](const QModelIndex &s, int role) -> QVariant {
              const qint64 n = s.data(ConversationListModel::UnreadRole).toLongLong();
              if (role == Qt::DisplayRole)
                  return n;
              if (role == Qt::TextAlignmentRole)
                  return int(Qt::AlignCenter);
              if (role == Qt::BackgroundRole && n > 0)
                  return QColor(0x2b, 0x6c, 0xd4);
              if (role == Qt::ForegroundRole && n > 0)
                  return QColor(Qt::white);
              if (role == Qt::FontRole && n > 0) {
                  QFont f;
                  f.setBold(true);
                  return f;
              }
              return {};
          }},
         {tr("Head"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole)
                  return s.data(ConversationListModel::HeadRole);
              if (role == Qt::TextAlignmentRole)
                  return int(Qt::AlignCenter);
              return {};
          }},
         {tr("Read"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole)
                  return s.data(ConversationListModel::ReadRole);
              if (role == Qt::TextAlignmentRole)
                  return int(Qt::AlignCenter);
              return {};
          }}},
        this);
    convView_ = makeTable(QStringLiteral("convView"));
    convView_->setModel(convTable_);
    convView_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
    for (int c = 1; c < 4; ++c)
        convView_->horizontalHeader()->setSectionResizeMode(c, QHeaderView::ResizeToContents);
    connect(convView_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
            [this](const QModelIndex &cur) {
                if (!cur.isValid())
                    return;
                const QString conv = convTable_->sourceIndex(cur.row()).data(ConversationListModel::ConvRole).toString();
                if (!conv.isEmpty() && conv != currentConv_)
                    selectConversation(conv);
            });
    connect(convTable_, &QAbstractItemModel::rowsInserted, this, &ChatWindow::reselectConversation);
    connect(convTable_, &QAbstractItemModel::rowsRemoved, this, &ChatWindow::reselectConversation);
    connect(convTable_, &QAbstractItemModel::modelReset, this, &ChatWindow::reselectConversation);
    connect(convTable_, &QAbstractItemModel::dataChanged, this, &ChatWindow::updateConversationHeader);

    auto *l = new QVBoxLayout;
    l->addWidget(convView_);
    auto *g = group(tr("Conversations"), QStringLiteral("conversationPanel"), l);
    g->setMinimumWidth(230);
    return g;
}

QWidget *ChatWindow::buildMessagePanel() {
    msgTable_ = new RoleTableModel(
        msgs_,
        {{tr("Seq"),
          [](const QModelIndex &s, int role) -> QVariant {
              const qint64 seq = s.data(MessageListModel::SeqRole).toLongLong();
              if (role == Qt::DisplayRole)
                  return seq > 0 ? QVariant(seq) : QVariant(QStringLiteral("-"));
              if (role == Qt::TextAlignmentRole)
                  return int(Qt::AlignRight | Qt::AlignVCenter);
              return {};
          }},
         {tr("Time"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QDateTime t = s.data(MessageListModel::TimestampRole).toDateTime();
              if (role == Qt::DisplayRole)
                  return t.toLocalTime().toString(QStringLiteral("HH:mm:ss"));
              if (role == Qt::ToolTipRole)
                  return t.toLocalTime().toString(Qt::ISODateWithMs);
              return {};
          }},
         {tr("Sender"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole) {
                  const QString who = s.data(MessageListModel::SenderRole).toString();
                  return s.data(MessageListModel::IsOwnRole).toBool() ? who + QStringLiteral(" (you)") : who;
              }
              return {};
          }},
         {tr("Message"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QString kind = s.data(MessageListModel::KindRole).toString();
              const auto st = MessageState(s.data(MessageListModel::StateRole).toInt());
              if (kind == QLatin1String("gap")) {
                  if (role == Qt::DisplayRole || role == Qt::ToolTipRole)
                      return QStringLiteral("... gap: seqs %1-%2 not loaded (select it and press Fill gap)")
                          .arg(s.data(MessageListModel::GapFromRole).toLongLong())
                          .arg(s.data(MessageListModel::GapToRole).toLongLong());
                  if (role == Qt::ForegroundRole)
                      return QColor(0x80, 0x40, 0x00);
                  if (role == Qt::FontRole) {
                      QFont f;
                      f.setItalic(true);
                      return f;
                  }
                  return {};
              }
              if (role == Qt::DisplayRole || role == Qt::ToolTipRole) {
                  if (kind == QLatin1String("join"))
                      return QStringLiteral("%1 joined").arg(s.data(MessageListModel::UserRole).toString());
                  if (kind == QLatin1String("leave"))
                      return QStringLiteral("%1 left").arg(s.data(MessageListModel::UserRole).toString());
                  return s.data(MessageListModel::BodyRole);
              }
              if (role == Qt::FontRole && (kind != QLatin1String("msg") || st == MessageState::Recalled)) {
                  QFont f;
                  f.setItalic(true);
                  f.setStrikeOut(st == MessageState::Recalled);
                  return f;
              }
              if (role == Qt::ForegroundRole && (kind != QLatin1String("msg") || st == MessageState::Recalled))
                  return QColor(Qt::darkGray);
              return {};
          }},
         {tr("State"),
          [](const QModelIndex &s, int role) -> QVariant {
              const auto st = MessageState(s.data(MessageListModel::StateRole).toInt());
              if (s.data(MessageListModel::KindRole).toString() == QLatin1String("gap")) {
                  if (role == Qt::DisplayRole)
                      return QStringLiteral("Gap");
                  if (role == Qt::BackgroundRole)
                      return QColor(0xff, 0xe0, 0xb0);
                  return {};
              }
              if (role == Qt::DisplayRole)
                  return stateText(st, s.data(MessageListModel::ErrorCodeRole).toString());
              if (role == Qt::BackgroundRole)
                  return stateColor(st);
              if (role == Qt::FontRole && st != MessageState::Sent) {
                  QFont f;
                  f.setBold(true);
                  return f;
              }
              return {};
          }},
         {tr("Dup"),
          [](const QModelIndex &s, int role) -> QVariant {
              const bool dup = s.data(MessageListModel::DupRole).toBool();
              if (role == Qt::DisplayRole)
                  return dup ? QStringLiteral("dup") : QString();
              if (role == Qt::ToolTipRole && dup)
                  return QStringLiteral("the server answered dup:true: a resend of this cmid hit the original");
              if (role == Qt::ForegroundRole && dup)
                  return QColor(0xb0, 0x40, 0x00);
              return {};
          }},
         {tr("cmid"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QString cmid = s.data(MessageListModel::CmidRole).toString();
              if (role == Qt::DisplayRole)
                  return cmid.left(8);
              if (role == Qt::ToolTipRole)
                  return cmid;
              if (role == Qt::FontRole) {
                  QFont f(QStringLiteral("monospace"));
                  f.setStyleHint(QFont::Monospace);
                  return f;
              }
              return {};
          }}},
        this);
    messageView_ = makeTable(QStringLiteral("messageView"));
    messageView_->setModel(msgTable_);
    auto *h = messageView_->horizontalHeader();
    for (int c = 0; c < msgTable_->columnCount(); ++c)
        h->setSectionResizeMode(c, c == BodyColumn ? QHeaderView::Stretch : QHeaderView::ResizeToContents);
    messageView_->setContextMenuPolicy(Qt::CustomContextMenu);
    connect(messageView_, &QWidget::customContextMenuRequested, this, &ChatWindow::showMessageMenu);
    // The timeline is newest first (obligation 15): the newest message is the
    // top row. Follow it while the view is at the top. The table itself never
    // loads older rows (RoleTableModel does not forward fetchMore): that is
    // the "Load older" button, one fetchMore() per click.
    connect(msgTable_, &QAbstractItemModel::rowsAboutToBeInserted, this, [this] {
        const QScrollBar *sb = messageView_->verticalScrollBar();
        followTail_ = sb->value() <= sb->minimum();
    });
    connect(msgTable_, &QAbstractItemModel::rowsInserted, this, [this] {
        if (followTail_)
            QTimer::singleShot(0, messageView_, &QTableView::scrollToTop);
        scheduleReadMarker();
    });
    connect(msgTable_, &QAbstractItemModel::modelReset, this, [this] {
        QTimer::singleShot(0, messageView_, &QTableView::scrollToTop);
        scheduleReadMarker();
    });
    connect(msgTable_, &QAbstractItemModel::dataChanged, this, &ChatWindow::scheduleReadMarker);
    connect(messageView_->verticalScrollBar(), &QScrollBar::valueChanged, this, &ChatWindow::scheduleReadMarker);

    convHeader_ = new QLabel(tr("No conversation selected"));
    convHeader_->setObjectName(QStringLiteral("conversationHeader"));
    convHeader_->setTextFormat(Qt::RichText);

    sendEdit_ = new QLineEdit;
    sendEdit_->setObjectName(QStringLiteral("sendEdit"));
    sendEdit_->setPlaceholderText(tr("Type a message and press Enter"));
    sendEdit_->setMaxLength(4000);
    sendButton_ = new QPushButton(tr("Send"));
    sendButton_->setObjectName(QStringLiteral("sendButton"));
    connect(sendEdit_, &QLineEdit::returnPressed, this, &ChatWindow::sendTyped);
    connect(sendButton_, &QPushButton::clicked, this, &ChatWindow::sendTyped);
    auto *sendRow = new QHBoxLayout;
    sendRow->addWidget(sendEdit_, 1);
    sendRow->addWidget(sendButton_);

    // History window: what the model shows and what the client loads.
    loadOlderButton_ = new QPushButton(tr("Load older"));
    loadOlderButton_->setObjectName(QStringLiteral("loadOlderButton"));
    loadOlderButton_->setToolTip(tr("MessageListModel::fetchMore(): older rows from the local store, else a "
                                    "history window from the server"));
    connect(loadOlderButton_, &QPushButton::clicked, this, &ChatWindow::loadOlder);
    fillGapButton_ = new QPushButton(tr("Fill gap"));
    fillGapButton_->setObjectName(QStringLiteral("fillGapButton"));
    fillGapButton_->setToolTip(tr("MessageListModel::fillGap(): loads the newest part of the selected gap row "
                                  "(or of the newest gap when none is selected)"));
    connect(fillGapButton_, &QPushButton::clicked, this, &ChatWindow::fillSelectedGap);
    windowRowsSpin_ = new QSpinBox;
    windowRowsSpin_->setObjectName(QStringLiteral("windowRowsSpin"));
    windowRowsSpin_->setRange(1, 1000);
    windowRowsSpin_->setValue(msgs_->windowRows());
    windowRowsSpin_->setToolTip(tr("Rows shown at first and added by each Load older"));
    connect(windowRowsSpin_, &QSpinBox::valueChanged, msgs_, &MessageListModel::setWindowRows);
    historyWindowSpin_ = new QSpinBox;
    historyWindowSpin_->setObjectName(QStringLiteral("historyWindowSpin"));
    historyWindowSpin_->setRange(1, 200);
    historyWindowSpin_->setValue(100);
    historyWindowSpin_->setToolTip(tr("Client::setHistoryWindow(): events per history window from the server"));
    connect(historyWindowSpin_, &QSpinBox::valueChanged, client_, &im::Client::setHistoryWindow);
    backlogLimitSpin_ = new QSpinBox;
    backlogLimitSpin_->setObjectName(QStringLiteral("backlogLimitSpin"));
    backlogLimitSpin_->setRange(0, 1000000);
    backlogLimitSpin_->setValue(1000);
    backlogLimitSpin_->setSpecialValueText(tr("off"));
    backlogLimitSpin_->setToolTip(tr("Client::setBacklogLimit(): a conversation further behind than this opens "
                                     "with its newest window and a gap (0: always sync everything)"));
    connect(backlogLimitSpin_, &QSpinBox::valueChanged, client_, &im::Client::setBacklogLimit);
    historyLabel_ = new QLabel;
    historyLabel_->setObjectName(QStringLiteral("historyLabel"));
    connect(msgs_, &MessageListModel::loadingOlderChanged, this, &ChatWindow::updateHistoryControls);
    connect(msgs_, &QAbstractItemModel::rowsInserted, this, &ChatWindow::updateHistoryControls);
    connect(msgs_, &QAbstractItemModel::rowsRemoved, this, &ChatWindow::updateHistoryControls);
    connect(msgs_, &QAbstractItemModel::modelReset, this, &ChatWindow::updateHistoryControls);
    connect(msgs_, &QAbstractItemModel::dataChanged, this, &ChatWindow::updateHistoryControls);
    auto *historyRow = new QHBoxLayout;
    historyRow->addWidget(loadOlderButton_);
    historyRow->addWidget(fillGapButton_);
    historyRow->addWidget(new QLabel(tr("Rows:")));
    historyRow->addWidget(windowRowsSpin_);
    historyRow->addWidget(new QLabel(tr("Window:")));
    historyRow->addWidget(historyWindowSpin_);
    historyRow->addWidget(new QLabel(tr("Backlog limit:")));
    historyRow->addWidget(backlogLimitSpin_);
    historyRow->addWidget(historyLabel_, 1);

    discardButton_ = new QPushButton(tr("Discard"));
    discardButton_->setObjectName(QStringLiteral("discardButton"));
    discardButton_->setToolTip(tr("Client::discard(): removes the selected Failed / Expired message of yours"));
    connect(discardButton_, &QPushButton::clicked, this, [this] {
        const QModelIndex cur = messageView_->currentIndex();
        if (!cur.isValid()) {
            statusBar()->showMessage(tr("Select a Failed or Expired message first"), 5000);
            return;
        }
        discardMessage(msgTable_->sourceIndex(cur.row()).data(MessageListModel::CmidRole).toString());
    });
    sendRow->addWidget(discardButton_);

    auto *hint = new QLabel(tr("Right-click one of your messages to recall it (Sent), cancel it (Pending, not on the "
                               "wire yet) or discard it (Failed / Expired). Read markers advance as messages "
                               "scroll into view."));
    hint->setStyleSheet(QStringLiteral("color: gray"));
    hint->setWordWrap(true);

    auto *l = new QVBoxLayout;
    l->addWidget(convHeader_);
    l->addLayout(historyRow);
    l->addWidget(messageView_, 1);
    l->addLayout(sendRow);
    l->addWidget(hint);
    return group(tr("Messages"), QStringLiteral("messagePanel"), l);
}

QWidget *ChatWindow::buildConnectionPanel() {
    connLabel_ = new QLabel;
    connLabel_->setObjectName(QStringLiteral("connectionLabel"));
    connLabel_->setTextFormat(Qt::RichText);
    connLabel_->setWordWrap(true);
    identityLabel_ = new QLabel;
    identityLabel_->setObjectName(QStringLiteral("identityLabel"));
    identityLabel_->setWordWrap(true);
    identityLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
    auto *tlsLabel = new QLabel(tlsText());
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
        client_->setCredentials(token);
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
    connect(client_, &im::Client::tokenExpiresAtChanged, this, &ChatWindow::updateTokenExpiry);
    auto *tokenRow = new QHBoxLayout;
    tokenRow->addWidget(newTokenEdit_, 1);
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

    auto *syncAll = new QPushButton(tr("Sync all"));
    syncAll->setObjectName(QStringLiteral("syncAllButton"));
    connect(syncAll, &QPushButton::clicked, client_, &im::Client::syncAll);
    auto *resend = new QPushButton(tr("Resend pending"));
    resend->setObjectName(QStringLiteral("resendButton"));
    connect(resend, &QPushButton::clicked, client_, &im::Client::resendPending);
    auto *buttons = new QHBoxLayout;
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
    return group(tr("Connection"), QStringLiteral("connectionPanel"), l);
}

QWidget *ChatWindow::buildFaultPanel() {
    offlineButton_ = new QPushButton(tr("Go offline"));
    offlineButton_->setObjectName(QStringLiteral("offlineButton"));
    offlineButton_->setCheckable(true);
    connect(offlineButton_, &QPushButton::toggled, clientFaults_, &im::testing::Faults::setOffline);
    connect(clientFaults_, &im::testing::Faults::offlineChanged, this, [this](bool off) {
        const QSignalBlocker block(offlineButton_);
        offlineButton_->setChecked(off);
        offlineButton_->setText(off ? tr("Go online") : tr("Go offline"));
    });
    auto *drop = new QPushButton(tr("Drop next reply"));
    drop->setObjectName(QStringLiteral("dropReplyButton"));
    drop->setToolTip(tr("The client ignores the next reply frame: the request times out and is resent with the same cmid"));
    connect(drop, &QPushButton::clicked, this, [this] {
        clientFaults_->dropNextReply();
        statusBar()->showMessage(tr("The next reply will be dropped"), 5000);
    });
    auto *closeNow = new QPushButton(tr("Close socket now"));
    closeNow->setObjectName(QStringLiteral("closeSocketButton"));
    connect(closeNow, &QPushButton::clicked, clientFaults_, &im::testing::Faults::closeSocketNow);

    timeoutSpin_ = new QSpinBox;
    timeoutSpin_->setObjectName(QStringLiteral("timeoutSpin"));
    timeoutSpin_->setRange(200, 120000);
    timeoutSpin_->setSingleStep(500);
    timeoutSpin_->setSuffix(QStringLiteral(" ms"));
    timeoutSpin_->setValue(client_->requestTimeout());
    connect(timeoutSpin_, &QSpinBox::valueChanged, client_, &im::Client::setRequestTimeout);

    auto *clientRow = new QHBoxLayout;
    clientRow->addWidget(offlineButton_);
    clientRow->addWidget(drop);
    clientRow->addWidget(closeNow);

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
    connect(faults_, &FaultClient::answered, this, [this](int status, const QString &text) {
        faultAnswer_->setText(text);
        faultAnswer_->setStyleSheet(status == 200 ? QStringLiteral("color: #006000")
                                                  : QStringLiteral("color: #b00000"));
    });

    auto *form = new QFormLayout;
    form->addRow(clientRow);
    form->addRow(tr("Request timeout:"), timeoutSpin_);
    auto *serverTitle = new QLabel(tr("<b>Server fault point</b> (imserver --enable-faults)"));
    form->addRow(serverTitle);
    form->addRow(tr("Point:"), faultPoint_);
    form->addRow(tr("Action:"), faultAction_);
    form->addRow(tr("Count:"), armRow);
    form->addRow(faultAnswer_);
    form->addRow(labUrlLabel_);
    return group(tr("Faults"), QStringLiteral("faultPanel"), form);
}

QWidget *ChatWindow::buildOutboxPanel() {
    auto role = [](int r) {
        return [r](const QModelIndex &s, int role) -> QVariant {
            return role == Qt::DisplayRole ? s.data(r) : QVariant();
        };
    };
    outboxTable_ = new RoleTableModel(
        outbox_,
        {{tr("cmid"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole || role == Qt::ToolTipRole)
                  return s.data(OutboxModel::CmidRole);
              if (role == Qt::FontRole) {
                  QFont f(QStringLiteral("monospace"));
                  f.setStyleHint(QFont::Monospace);
                  return f;
              }
              return {};
          }},
         {tr("Kind"), role(OutboxModel::KindRole)},
         {tr("Conv"), role(OutboxModel::ConvRole)},
         {tr("Body / target"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role != Qt::DisplayRole)
                  return {};
              if (s.data(OutboxModel::KindRole).toString() == QLatin1String("recall"))
                  return QStringLiteral("recall seq %1").arg(s.data(OutboxModel::TargetRole).toLongLong());
              return s.data(OutboxModel::BodyRole);
          }},
         {tr("Attempts"), role(OutboxModel::AttemptsRole)},
         {tr("Last error"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QString e = s.data(OutboxModel::LastErrorRole).toString();
              if (role == Qt::DisplayRole)
                  return e.isEmpty() ? QStringLiteral("-") : e;
              if (role == Qt::ForegroundRole && !e.isEmpty())
                  return QColor(0xb0, 0x00, 0x00);
              return {};
          }},
         {tr("Next retry"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QDateTime t = s.data(OutboxModel::NextRetryAtRole).toDateTime();
              if (role == Qt::DisplayRole)
                  return relative(t);
              if (role == Qt::ToolTipRole && t.isValid())
                  return t.toLocalTime().toString(Qt::ISODateWithMs);
              return {};
          }},
         {tr("In flight"),
          [](const QModelIndex &s, int role) -> QVariant {
              return role == Qt::DisplayRole
                         ? (s.data(OutboxModel::InFlightRole).toBool() ? QStringLiteral("yes") : QStringLiteral("no"))
                         : QVariant();
          }},
         // The pipelining order: the unanswered message this one was sent
         // behind (its `prev`), which the server must commit first.
         {tr("After (prev)"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QString prev = s.data(OutboxModel::PrevRole).toString();
              if (role == Qt::DisplayRole)
                  return prev.isEmpty() ? QStringLiteral("-") : prev.left(8);
              if (role == Qt::ToolTipRole)
                  return prev.isEmpty() ? tr("sent behind nothing unanswered")
                                        : tr("sent behind %1: appended only once that one is committed").arg(prev);
              return {};
          }}},
        this);
    outboxView_ = makeTable(QStringLiteral("outboxView"));
    outboxView_->setModel(outboxTable_);
    for (int c = 0; c < outboxTable_->columnCount(); ++c)
        outboxView_->horizontalHeader()->setSectionResizeMode(c, c == OWhat ? QHeaderView::Stretch
                                                                            : QHeaderView::ResizeToContents);
    outboxView_->setContextMenuPolicy(Qt::CustomContextMenu);
    connect(outboxView_, &QWidget::customContextMenuRequested, this, [this](const QPoint &pos) {
        const QModelIndex idx = outboxView_->indexAt(pos);
        if (!idx.isValid())
            return;
        const QString cmid = outbox_->get(idx.row(), OutboxModel::CmidRole).toString();
        QMenu menu(this);
        menu.setObjectName(QStringLiteral("outboxMenu"));
        QAction *cancel = menu.addAction(tr("Cancel (not sent yet)"));
        cancel->setObjectName(QStringLiteral("cancelOutboxAction"));
        cancel->setEnabled(outbox_->get(idx.row(), OutboxModel::AttemptsRole).toInt() == 0);
        connect(cancel, &QAction::triggered, this, [this, cmid] { cancelOutboxEntry(cmid); });
        menu.exec(outboxView_->viewport()->mapToGlobal(pos));
    });
    outboxDepth_ = new QLabel;
    outboxDepth_->setObjectName(QStringLiteral("outboxDepth"));
    auto *cancelSelected = new QPushButton(tr("Cancel selected"));
    cancelSelected->setObjectName(QStringLiteral("cancelOutboxButton"));
    cancelSelected->setToolTip(tr("Client::cancel(): withdraws a Pending entry no attempt of which went on the wire; "
                                  "one already sent is refused (recall it once it is Sent)"));
    connect(cancelSelected, &QPushButton::clicked, this, [this] {
        const QModelIndex cur = outboxView_->currentIndex();
        if (!cur.isValid()) {
            statusBar()->showMessage(tr("Select an outbox entry first"), 5000);
            return;
        }
        cancelOutboxEntry(outbox_->get(cur.row(), OutboxModel::CmidRole).toString());
    });
    auto *top = new QHBoxLayout;
    top->addWidget(outboxDepth_, 1);
    top->addWidget(cancelSelected);
    auto *l = new QVBoxLayout;
    l->addLayout(top);
    l->addWidget(outboxView_, 1);
    auto *g = group(tr("Outbox (durable, resent with the same cmid)"), QStringLiteral("outboxPanel"), l);
    g->setMinimumHeight(150);
    return g;
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

// --- behaviour --------------------------------------------------------------

void ChatWindow::selectConversation(const QString &conv) {
    if (conv != currentConv_) {
        currentConv_ = conv;
        msgs_->setConversation(conv);
    }
    const int row = convs_->indexOf(conv);
    if (row >= 0 && convView_->currentIndex().row() != row)
        convView_->setCurrentIndex(convTable_->index(row, 0));
    else if (row < 0 && !conv.isEmpty())
        convView_->setCurrentIndex(QModelIndex()); // not listed (yet): no stale highlight
    updateConversationHeader();
    scheduleReadMarker();
}

void ChatWindow::reselectConversation() {
    if (currentConv_.isEmpty()) {
        if (convs_->rowCount() > 0)
            selectConversation(convs_->get(0, ConversationListModel::ConvRole).toString());
        return;
    }
    selectConversation(currentConv_);
}

void ChatWindow::sendTyped() {
    const QString text = sendEdit_->text();
    if (text.trimmed().isEmpty())
        return;
    if (currentConv_.isEmpty()) {
        statusBar()->showMessage(tr("Pick a conversation first"), 5000);
        return;
    }
    const QString cmid = client_->send(currentConv_, text);
    if (cmid.isEmpty()) {
        statusBar()->showMessage(tr("Not queued: %1").arg(client_->lastError()), 10000);
        return;
    }
    sendEdit_->clear();
    followTail_ = true;
    statusBar()->showMessage(tr("Queued %1 (durable; cmid %2)").arg(text.left(30), cmid), 5000);
}

void ChatWindow::showMessageMenu(const QPoint &pos) {
    const QModelIndex idx = messageView_->indexAt(pos);
    if (!idx.isValid())
        return;
    const QModelIndex src = msgTable_->sourceIndex(idx.row());
    const qint64 seq = src.data(MessageListModel::SeqRole).toLongLong();
    const bool own = src.data(MessageListModel::IsOwnRole).toBool();
    const auto st = MessageState(src.data(MessageListModel::StateRole).toInt());
    const bool isMsg = src.data(MessageListModel::KindRole).toString() == QLatin1String("msg");
    const QString cmid = src.data(MessageListModel::CmidRole).toString();
    const QString conv = currentConv_;

    QMenu menu(this);
    menu.setObjectName(QStringLiteral("messageMenu"));
    QAction *recall = menu.addAction(seq > 0 ? tr("Recall (seq %1)").arg(seq) : tr("Recall"));
    recall->setObjectName(QStringLiteral("recallAction"));
    // Others' messages stay recallable on purpose: QA sees NOT_SENDER.
    recall->setEnabled(isMsg && seq > 0 && st == MessageState::Sent);
    if (!own)
        recall->setText(recall->text() + tr(" - not yours: expect NOT_SENDER"));
    connect(recall, &QAction::triggered, this, [this, conv, seq] {
        const QString rc = client_->recall(conv, seq);
        if (rc.isEmpty()) {
            statusBar()->showMessage(tr("Recall not queued: %1").arg(client_->lastError()), 10000);
            return;
        }
        recallCmids_.insert(rc);
        statusBar()->showMessage(tr("Recall of seq %1 queued (request %2)").arg(seq).arg(rc.left(8)), 10000);
    });
    QAction *cancel = menu.addAction(tr("Cancel (not sent yet)"));
    cancel->setObjectName(QStringLiteral("cancelAction"));
    cancel->setEnabled(own && !cmid.isEmpty() && st == MessageState::Pending);
    connect(cancel, &QAction::triggered, this, [this, cmid] { cancelOutboxEntry(cmid); });
    QAction *discard = menu.addAction(tr("Discard"));
    discard->setObjectName(QStringLiteral("discardAction"));
    discard->setEnabled(!cmid.isEmpty() && (st == MessageState::Failed || st == MessageState::Expired));
    connect(discard, &QAction::triggered, this, [this, cmid] { discardMessage(cmid); });
    QAction *copy = menu.addAction(tr("Copy cmid"));
    copy->setObjectName(QStringLiteral("copyCmidAction"));
    copy->setEnabled(!cmid.isEmpty());
    connect(copy, &QAction::triggered, this, [cmid] { QGuiApplication::clipboard()->setText(cmid); });
    menu.exec(messageView_->viewport()->mapToGlobal(pos));
}

void ChatWindow::cancelOutboxEntry(const QString &cmid) {
    const bool ok = client_->cancel(cmid);
    lastActionText_ = ok ? tr("Cancelled %1: it never left, it is gone from the outbox and the timeline").arg(cmid)
                         : tr("Not cancelled: %1").arg(client_->lastError());
    statusBar()->showMessage(lastActionText_, 10000);
}

void ChatWindow::discardMessage(const QString &cmid) {
    const bool ok = !cmid.isEmpty() && client_->discard(cmid);
    lastActionText_ = ok ? tr("Discarded %1").arg(cmid)
                         : tr("Not discarded: %1")
                               .arg(cmid.isEmpty() ? tr("not one of your messages") : client_->lastError());
    statusBar()->showMessage(lastActionText_, 10000);
}

void ChatWindow::loadOlder() {
    if (!msgs_->canFetchMore()) {
        statusBar()->showMessage(tr("Nothing older to load"), 5000);
        return;
    }
    msgs_->fetchMore();
    updateHistoryControls();
}

void ChatWindow::fillSelectedGap() {
    int row = -1;
    const QModelIndex cur = messageView_->currentIndex();
    if (cur.isValid() && msgs_->get(cur.row(), MessageListModel::KindRole).toString() == QLatin1String("gap"))
        row = cur.row();
    for (int r = 0; row < 0 && r < msgs_->rowCount(); ++r) // newest first: the newest gap
        if (msgs_->get(r, MessageListModel::KindRole).toString() == QLatin1String("gap"))
            row = r;
    if (row < 0) {
        statusBar()->showMessage(tr("No gap in this view"), 5000);
        return;
    }
    const qint64 from = msgs_->get(row, MessageListModel::GapFromRole).toLongLong();
    const qint64 to = msgs_->get(row, MessageListModel::GapToRole).toLongLong();
    const bool ok = msgs_->fillGap(row);
    statusBar()->showMessage(ok ? tr("Loading the newest events of gap %1-%2").arg(from).arg(to)
                                : tr("Gap %1-%2 not filled (offline or already loading)").arg(from).arg(to),
                             5000);
}

void ChatWindow::updateHistoryControls() {
    int gaps = 0;
    for (int r = 0; r < msgs_->rowCount(); ++r)
        if (msgs_->get(r, MessageListModel::KindRole).toString() == QLatin1String("gap"))
            ++gaps;
    loadOlderButton_->setEnabled(msgs_->canFetchMore());
    fillGapButton_->setEnabled(gaps > 0);
    historyLabel_->setText(msgs_->isLoadingOlder() ? tr("loading older...")
                                                   : tr("%1 rows, %2 gap(s)%3")
                                                         .arg(msgs_->rowCount())
                                                         .arg(gaps)
                                                         .arg(msgs_->canFetchMore() ? tr(", older exist")
                                                                                    : QString()));
}

QString ChatWindow::connectionText() const {
    const QString url = client_->currentServer().toString();
    switch (client_->connectionState()) {
    case ConnectionState::Disconnected:
        if (client_->isInstallStale())
            return QStringLiteral("Disconnected (stale install)");
        return clientFaults_->isOffline() ? QStringLiteral("Offline (simulated)") : QStringLiteral("Disconnected");
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

void ChatWindow::updateConnection() {
    QString color;
    switch (client_->connectionState()) {
    case ConnectionState::Disconnected: color = QStringLiteral("#808080"); break;
    case ConnectionState::Connecting: color = QStringLiteral("#d08000"); break;
    case ConnectionState::Connected: color = QStringLiteral("#00a000"); break;
    case ConnectionState::Reconnecting: color = QStringLiteral("#d00000"); break;
    }
    const QString text = connectionText();
    connLabel_->setText(QStringLiteral("<span style='color:%1; font-size:16pt'>&#9679;</span> <b>%2</b>")
                            .arg(color, text.toHtmlEscaped()));
    statusConn_->setText(text);
    labUrlLabel_->setText(tr("Lab endpoint: %1").arg(FaultClient::labUrl(labServer()).toString()));
    updateIdentity();
}

void ChatWindow::updateIdentity() {
    const QString user = client_->userId().isEmpty() ? session_.user : client_->userId();
    const QString device = client_->deviceId().isEmpty() ? session_.device : client_->deviceId();
    QStringList servers;
    for (const QUrl &u : client_->servers())
        servers << u.toString();
    identityLabel_->setText(tr("User %1, device %2\nInstall %3\nDatabase %4\nServers %5")
                                .arg(user.isEmpty() ? tr("(unknown until welcome)") : user,
                                     device.isEmpty() ? QStringLiteral("-") : device, client_->installId(),
                                     client_->databasePath(), servers.join(QStringLiteral(", "))));
    setWindowTitle(QStringLiteral("imdemo - %1 (%2)%3")
                       .arg(user.isEmpty() ? session_.label() : user, device.isEmpty() ? QStringLiteral("?") : device,
                            client_->gatewayId().isEmpty() ? QString() : QStringLiteral(" @ ") + client_->gatewayId()));
}

void ChatWindow::updateConversationHeader() {
    const int row = convs_->indexOf(currentConv_);
    if (currentConv_.isEmpty() || row < 0) {
        convHeader_->setText(currentConv_.isEmpty() ? tr("No conversation selected")
                                                    : QStringLiteral("<b>%1</b>").arg(currentConv_.toHtmlEscaped()));
        return;
    }
    auto v = [&](int r) { return convs_->get(row, r); };
    QString text = QStringLiteral("<b>%1</b> (%2) &nbsp; head %3 &middot; read %4 &middot; delivered %5 &middot; "
                                  "unread %6 &middot; epoch %7")
                       .arg(currentConv_.toHtmlEscaped(), v(ConversationListModel::KindRole).toString())
                       .arg(v(ConversationListModel::HeadRole).toLongLong())
                       .arg(v(ConversationListModel::ReadRole).toLongLong())
                       .arg(v(ConversationListModel::DeliveredRole).toLongLong())
                       .arg(v(ConversationListModel::UnreadRole).toLongLong())
                       .arg(v(ConversationListModel::EpochRole).toLongLong());
    if (v(ConversationListModel::HasGapRole).toBool())
        text += QStringLiteral(" &middot; <span style='color:#b00000'>gap: events purged before this device saw them</span>");
    convHeader_->setText(text);
}

void ChatWindow::updateOutboxDepth() {
    const int n = client_->pendingCount();
    outboxDepth_->setText(tr("Queue depth: <b>%1</b>").arg(n));
}

void ChatWindow::updateTokenExpiry() {
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

void ChatWindow::scheduleReadMarker() {
    if (!readTimer_->isActive())
        readTimer_->start();
}

// Marks read up to the newest message the user can see in the view: the
// timeline is newest first, so the rows inside the viewport, the newest on top.
void ChatWindow::advanceReadMarker() {
    if (currentConv_.isEmpty() || !isVisible() || isMinimized() || msgs_->conversation() != currentConv_)
        return;
    const int rows = msgTable_->rowCount();
    if (rows == 0)
        return;
    const int first = std::max(0, messageView_->rowAt(0));
    int last = messageView_->rowAt(messageView_->viewport()->height() - 1);
    if (last < 0)
        last = rows - 1;
    qint64 seq = 0;
    for (int r = first; r <= last && r < rows; ++r)
        seq = qMax(seq, msgs_->get(r, MessageListModel::SeqRole).toLongLong());
    const int crow = convs_->indexOf(currentConv_);
    // The top (newest) row is in view: everything applied so far has been
    // seen, including events that are not rows (recalls).
    if (first == 0 && crow >= 0)
        seq = qMax(seq, convs_->get(crow, ConversationListModel::CursorRole).toLongLong());
    if (seq <= 0)
        return;
    const qint64 read = crow >= 0 ? convs_->get(crow, ConversationListModel::ReadRole).toLongLong() : 0;
    if (seq <= read || seq <= readRequested_.value(currentConv_))
        return;
    if (client_->markRead(currentConv_, seq))
        readRequested_.insert(currentConv_, seq);
}

QUrl ChatWindow::labServer() const {
    const QUrl cur = client_->currentServer();
    if (cur.isValid() && !cur.host().isEmpty())
        return cur;
    return session_.servers.value(0);
}

void ChatWindow::armServerFault(bool off) {
    const QString body = off ? QStringLiteral("off")
                             : FaultClient::spec(faultPoint_->currentText(), faultAction_->currentText(),
                                                 faultCount_->value());
    faultAnswer_->setText(tr("posting \"%1\"...").arg(body));
    faultAnswer_->setStyleSheet(QString());
    faults_->post(labServer(), body);
}
