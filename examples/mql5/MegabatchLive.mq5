//+------------------------------------------------------------------+
//| MegabatchLive.mq5 - an Expert Advisor that runs a megabatch model |
//| through mtf_live.dll (examples/dll/mtf_live_dll.h): one call per  |
//| closed M1 bar, K predictions back, in the strategy tester too.    |
//| docs/TRADING.md ("MetaTrader 5: the DLL"). Not compiled here (no  |
//| MetaTrader on the CI machine): the C host tests/cross/live_host.c |
//| makes the same calls under Wine in CI.                            |
//|                                                                   |
//| Install: mtf_live.dll (make build/cross/win/mtf_live.dll) into    |
//| MQL5\Libraries, the model (train_multitf --export [--carry]) into |
//| MQL5\Files, allow DLL imports (Tools > Options > Expert Advisors, |
//| and the EA's Dependencies tab).                                   |
//+------------------------------------------------------------------+
#property copyright "megabatch, MIT"
#property version   "1.00"
#property strict

#import "mtf_live.dll"
int  mtfl_version();
int  mtfl_open_w(string path, int mode, int threads);
int  mtfl_close(int h);
int  mtfl_outputs(int h);
long mtfl_bars(int h);
int  mtfl_push(int h, long t, double open, double high, double low, double close, double volume,
               double &pred[], int pred_len);
int  mtfl_push_bars(int h, const long &t[], const double &open[], const double &high[], const double &low[],
                    const double &close[], const double &volume[], int n, double &pred[], int pred_len);
int  mtfl_last_error_w(ushort &buf[], int len);
#import

// mtf_live_dll.h's values
#define MTFL_WINDOW    0
#define MTFL_STATEFUL  1
#define MTFL_READY     1
#define MTFL_WARMUP    0
#define MTFL_ERR_BAR  -4

input string InpModel      = "model.safetensors"; // in MQL5\Files
input bool   InpStateful   = true;                // O(1) a bar: needs a model trained with --carry
input int    InpHistory    = 20000;               // closed M1 bars pushed at start (the windows' warm-up)
input int    InpThreads    = 1;
input int    InpTarget     = 0;                   // which of the K outputs drives the signal
input double InpThreshold  = 0.0;                 // signal: prediction above +thr buy, below -thr sell

int      g_h = 0;
int      g_K = 0;
datetime g_last = 0;      // start time of the last M1 bar pushed
double   g_pred[];        // the K predictions of the last ready bar
bool     g_ready = false;

string LastError() {
   ushort buf[512];
   mtfl_last_error_w(buf, 512);
   return ShortArrayToString(buf);
}

// Push closed M1 bars from g_last (exclusive) up to the last closed one, oldest first.
bool PushNewBars() {
   MqlRates r[];
   ArraySetAsSeries(r, false);
   int n = g_last == 0 ? CopyRates(_Symbol, PERIOD_M1, 1, InpHistory, r)
                       : CopyRates(_Symbol, PERIOD_M1, g_last + 60, TimeCurrent(), r);
   if (n <= 0) return true;
   for (int i = 0; i < n; i++) {
      if (r[i].time <= g_last) continue;
      if (r[i].time + 60 > TimeCurrent()) break;               // still forming
      double p[];
      ArrayResize(p, g_K);
      int rc = mtfl_push(g_h, (long)r[i].time, r[i].open, r[i].high, r[i].low, r[i].close,
                         (double)r[i].tick_volume, p, g_K);
      if (rc == MTFL_ERR_BAR) { Print("bar refused: ", LastError()); continue; } // the handle goes on
      if (rc < 0) { Print("mtf_live: ", LastError()); return false; }
      g_last = r[i].time;
      if (rc == MTFL_READY) { ArrayCopy(g_pred, p); g_ready = true; }
   }
   return true;
}

int OnInit() {
   if (mtfl_version() != 1) { Print("mtf_live.dll: ABI version ", mtfl_version(), ", this EA speaks 1"); return INIT_FAILED; }
   string path = TerminalInfoString(TERMINAL_DATA_PATH) + "\\MQL5\\Files\\" + InpModel;
   g_h = mtfl_open_w(path, InpStateful ? MTFL_STATEFUL : MTFL_WINDOW, InpThreads);
   if (g_h <= 0) { Print("mtf_live: ", path, ": ", LastError()); return INIT_FAILED; }
   g_K = mtfl_outputs(g_h);
   ArrayResize(g_pred, g_K);
   if (!PushNewBars()) return INIT_FAILED;
   PrintFormat("mtf_live: %s, K=%d, %I64d bars pushed, %s", InpModel, g_K, mtfl_bars(g_h),
               g_ready ? "ready" : "warming up");
   return INIT_SUCCEEDED;
}

void OnDeinit(const int reason) {
   if (g_h > 0) mtfl_close(g_h);
   g_h = 0;
}

void OnTick() {
   datetime closed = iTime(_Symbol, PERIOD_M1, 1);          // the last closed M1 bar
   if (closed <= g_last) return;                            // nothing new closed
   if (!PushNewBars() || !g_ready) return;
   double y = g_pred[InpTarget];
   string s = y > InpThreshold ? "buy" : y < -InpThreshold ? "sell" : "flat";
   Comment(StringFormat("megabatch %s: pred[%d] = %.6f -> %s", TimeToString(g_last), InpTarget, y, s));
   // Order placement is the strategy's: e.g. CTrade.Buy/Sell on a change of signal.
}
//+------------------------------------------------------------------+
