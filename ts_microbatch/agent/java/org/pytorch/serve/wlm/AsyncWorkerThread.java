package org.pytorch.serve.wlm;

import io.netty.bootstrap.Bootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFutureListener;
import io.netty.channel.ChannelHandler;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.SimpleChannelInboundHandler;
import io.netty.handler.codec.ByteToMessageDecoder;
import io.netty.handler.codec.http.multipart.HttpPostRequestDecoder.NotEnoughDataDecoderException;
import java.io.IOException;
import java.net.HttpURLConnection;
import java.net.SocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import org.pytorch.serve.job.Job;
import org.pytorch.serve.job.RestJob;
import org.pytorch.serve.util.ConfigManager;
import org.pytorch.serve.util.Connector;
import org.pytorch.serve.util.codec.CodecUtils;
import org.pytorch.serve.util.messages.InputParameter;
import org.pytorch.serve.util.messages.ModelWorkerResponse;
import org.pytorch.serve.util.messages.Predictions;
import org.pytorch.serve.util.messages.RequestInput;
import org.pytorch.serve.util.messages.WorkerCommands;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * TorchServe 0.12.0's AsyncWorkerThread with a restart that works; loaded in its place by the
 * ts-microbatch agent. The thread writes each polled request to the backend without waiting
 * for its answer; Netty's thread hands answers to the aggregator. Same constructor and
 * protected fields; each change is marked "Fix:".
 *
 * <p>Its nested classes have names 0.12.0's does not use (ResponseHandler, Pipeline): they
 * load from the agent's jar, never mixed with 0.12.0's AsyncWorkerHandler and AsyncWorkerThread$1.
 */
public class AsyncWorkerThread extends WorkerThread {
    protected static final Logger logger = LoggerFactory.getLogger(AsyncWorkerThread.class);
    protected static final long WORKER_TIMEOUT = 2L;

    /** Fix: volatile: written on Netty's thread (the load's answer), read on the worker's. */
    protected volatile boolean loadingFinished;

    protected volatile CountDownLatch latch;

    public AsyncWorkerThread(
            ConfigManager configManager,
            EventLoopGroup backendEventGroup,
            int port,
            int gpuId,
            Model model,
            BatchAggregator aggregator,
            WorkerStateListener listener) {
        super(configManager, backendEventGroup, port, gpuId, model, aggregator, listener);
        loadingFinished = false;
    }

    @Override
    public void run() {
        responseTimeout = model.getResponseTimeout();
        startupTimeout = model.getStartupTimeout();
        Thread thread = Thread.currentThread();
        thread.setName(getWorkerName());
        currentThread.set(thread);
        req = null;
        // Fix: a restart runs this same object again (retry() resubmits `this`) on a new
        // backend process that has yet to load the model. 0.12.0 left loadingFinished true
        // from the first load, so the restarted thread did not wait for the load: it wrote
        // queued requests behind it and polled them beside the LOAD job still in the batch.
        loadingFinished = false;
        int status = HttpURLConnection.HTTP_INTERNAL_ERROR;
        try {
            connect();
            while (isRunning()) {
                req = aggregator.getRequest(workerId, state);
                boolean loading = !loadingFinished;
                if (loading) {
                    // Fix: armed before the write; the answer can arrive before the next line.
                    latch = new CountDownLatch(1);
                }
                // Fix: a write that is interrupted (the channel closed: its listener interrupts
                // this thread) or fails ends the thread like any other backend failure, and the
                // finally block restarts the worker. 0.12.0 caught the InterruptedException
                // here and went on polling and writing to a closed channel.
                backendChannel.get(0).writeAndFlush(req).sync();
                if (loading && !latch.await(startupTimeout, TimeUnit.SECONDS)) {
                    throw new WorkerInitializationException(
                            "Worker did not load the model within " + startupTimeout + " seconds");
                }
                req = null;
            }
        } catch (InterruptedException e) {
            if (state == WorkerState.WORKER_SCALED_DOWN || state == WorkerState.WORKER_STOPPED) {
                logger.debug("Shutting down the thread .. Scaling down.");
            } else {
                logger.debug("Backend worker monitoring thread interrupted or backend died", e);
            }
        } catch (WorkerInitializationException e) {
            logger.error("Backend worker error", e);
        } catch (OutOfMemoryError oom) {
            logger.error("Out of memory error when creating workers", oom);
            status = HttpURLConnection.HTTP_ENTITY_TOO_LARGE;
            countServerError(oom);
        } catch (IllegalStateException e) {
            logger.error("IllegalStateException error", e);
        } catch (Throwable t) {
            logger.warn("Backend worker thread exception.", t);
            countServerError(t);
        } finally {
            // As in 0.12.0: this pool thread may run another worker next; the reference must
            // go so that a late interrupt cannot reach it.
            for (Channel channel : backendChannel) {
                channel.disconnect();
            }
            backendChannel.clear();
            currentThread.set(null);
            Integer exitValue = lifeCycle.getExitValue();
            if (exitValue != null && exitValue == 137) {
                status = HttpURLConnection.HTTP_ENTITY_TOO_LARGE;
            }
            if (req != null) {
                aggregator.sendError(req, "Worker died.", status);
            }
            aggregator.cleanJobs(); // the replaced aggregator also fails what the backend held
            setState(WorkerState.WORKER_STOPPED, status);
            lifeCycle.exit();
            if (isHealthy()) { // still within the model's maxRetryTimeoutInSec
                retry();
            }
        }
    }

    private static void countServerError(Throwable t) {
        ConfigManager config = ConfigManager.getInstance();
        if (config.isTelemetryEnabled()) {
            loggerTelemetryMetrics.info(
                    "ModelServerError.Count:1|#TorchServe:{},{}:-1",
                    config.getVersion(),
                    t.getClass().getCanonicalName());
        }
    }

    @Override
    protected void connect() throws WorkerInitializationException, InterruptedException {
        if (!configManager.isDebug()) {
            lifeCycle.startWorker(port, getDeviceIds());
        }
        setState(WorkerState.WORKER_STARTED, HttpURLConnection.HTTP_OK);
        Channel channel;
        try {
            Connector connector = new Connector(port);
            Bootstrap bootstrap =
                    new Bootstrap()
                            .group(backendEventGroup)
                            .channel(connector.getClientChannel())
                            .handler(new Pipeline(configManager.getMaxResponseSize()));
            SocketAddress address = connector.getSocketAddress();
            logger.info("Connecting to: {}", address);
            channel = bootstrap.connect(address).sync().channel();
        } catch (InterruptedException | RuntimeException e) {
            throw e;
        } catch (Exception e) { // Netty rethrows the connect's IOException undeclared
            if (e instanceof IOException) {
                throw new WorkerInitializationException("Failed to connect to worker.", e);
            }
            throw new WorkerInitializationException("Failed to connect to worker: " + e, e);
        }
        backendChannel.add(channel);
        watchResponseTimeout(channel);
        channel.closeFuture()
                .addListener(
                        (ChannelFutureListener)
                                future -> {
                                    logger.info("{} Worker disconnected. {}", getWorkerId(), state);
                                    Thread worker = currentThread.getAndSet(null);
                                    if (worker != null) {
                                        worker.interrupt();
                                    }
                                });
        // The model's load goes first through this worker's own queue. Should the channel
        // already be closed, the listener above has interrupted this thread, which stops at
        // its next wait.
        RequestInput input = new RequestInput(UUID.randomUUID().toString());
        if (gpuId >= 0) {
            input.addParameter(new InputParameter("gpu", String.valueOf(gpuId)));
        }
        model.addJob(
                workerId,
                new RestJob(
                        null, model.getModelName(), model.getVersion(), WorkerCommands.LOAD, input));
        running.set(true);
    }

    /**
     * Fix: {@code responseTimeout} per job (AsyncBatchAggregator.expire), checked every second
     * on the channel's event loop while the channel lives; a worker that lets a job time out
     * and has answered nothing for as long is restarted (its channel closed), as the
     * synchronous worker is at a timeout. One that still answers others keeps running.
     */
    private void watchResponseTimeout(Channel channel) {
        if (!(aggregator instanceof AsyncBatchAggregator)) {
            return;
        }
        AsyncBatchAggregator jobs = (AsyncBatchAggregator) aggregator;
        Runnable check =
                () -> {
                    long timeoutMs = responseTimeout * 1000L;
                    List<Job> expired = jobs.expire(timeoutMs);
                    if (expired.isEmpty()) {
                        return;
                    }
                    logger.error(
                            "{} jobs got no answer within responseTimeout {} s",
                            expired.size(),
                            responseTimeout);
                    Runnable answer =
                            () -> {
                                for (Job job : expired) {
                                    job.sendError(
                                            HttpURLConnection.HTTP_INTERNAL_ERROR,
                                            "Worker timed out: no answer within responseTimeout "
                                                    + responseTimeout
                                                    + " s");
                                }
                            };
                    if (jobs.silentFor(timeoutMs)) {
                        // Answered once the channel is closed: a client that sends again on
                        // this answer finds the worker restarting, its request queued.
                        logger.error("Worker answers nothing: restarting it");
                        channel.close().addListener(closed -> answer.run());
                    } else {
                        answer.run();
                    }
                };
        ScheduledFuture<?> watch =
                channel.eventLoop().scheduleAtFixedRate(check, 1, 1, TimeUnit.SECONDS);
        channel.closeFuture().addListener(future -> watch.cancel(false));
    }

    /** The backend channel's handlers: the request encoder, the answer decoder, the answers. */
    protected class Pipeline extends ChannelInitializer<Channel> {
        private final int maxResponseSize;

        Pipeline(int maxResponseSize) {
            this.maxResponseSize = maxResponseSize;
        }

        @Override
        public void initChannel(Channel ch) {
            ch.pipeline()
                    .addLast(ENCODER)
                    .addLast(new AnswerDecoder(maxResponseSize))
                    .addLast(new ResponseHandler());
        }
    }

    /**
     * 0.12.0's ModelResponseDecoder, but an answer over {@code max_response_size} fails its
     * own request and nothing else.
     *
     * <p>Fix: 0.12.0's decoder threw TooLongFrameException on it; the handler closed the
     * channel, and every request in flight on the worker got 500 "Worker died." and the worker
     * restarted (the synchronous worker holds one batch at a time: there only that batch
     * fails). Here the frame is read whole as before, the over-long answer's bytes are
     * dropped, and its request gets a 500 that says why.
     */
    protected static class AnswerDecoder extends ByteToMessageDecoder {
        private final int maxResponseSize;

        AnswerDecoder(int maxResponseSize) {
            this.maxResponseSize = maxResponseSize;
        }

        @Override
        protected void decode(ChannelHandlerContext ctx, ByteBuf in, List<Object> out) {
            if (in.readableBytes() < 9) {
                return;
            }
            in.markReaderIndex();
            boolean completed = false;
            try {
                ModelWorkerResponse response = new ModelWorkerResponse();
                response.setCode(in.readInt());
                response.setMessage(CodecUtils.readString(in, length(in)));
                List<Predictions> predictions = new ArrayList<>();
                int len;
                while ((len = length(in)) != CodecUtils.END) {
                    Predictions prediction = new Predictions();
                    prediction.setRequestId(CodecUtils.readString(in, len));
                    prediction.setContentType(CodecUtils.readString(in, length(in)));
                    if (in.readableBytes() < 4) {
                        return;
                    }
                    prediction.setStatusCode(in.readInt());
                    prediction.setReasonPhrase(CodecUtils.readString(in, length(in)));
                    prediction.setHeaders(CodecUtils.readMap(in, length(in)));
                    len = CodecUtils.readLength(in, Integer.MAX_VALUE); // checked here
                    if (len > maxResponseSize) {
                        in.skipBytes(len);
                        tooLong(prediction, len);
                    } else {
                        prediction.setResp(CodecUtils.read(in, len));
                    }
                    predictions.add(prediction);
                }
                response.setPredictions(predictions);
                out.add(response);
                completed = true;
            } catch (NotEnoughDataDecoderException e) {
                // the frame is not all here yet
            } finally {
                if (!completed) {
                    in.resetReaderIndex();
                }
            }
        }

        private int length(ByteBuf in) {
            return CodecUtils.readLength(in, maxResponseSize);
        }

        private void tooLong(Predictions prediction, int len) {
            logger.error(
                    "Answer of {} bytes for {} is over max_response_size {}: that request gets 500",
                    len,
                    prediction.getRequestId(),
                    maxResponseSize);
            String why =
                    "{\"code\": 500, \"type\": \"ResponseTooLarge\", \"message\": \"the answer"
                            + " is "
                            + len
                            + " bytes, over max_response_size "
                            + maxResponseSize
                            + "\"}";
            prediction.setStatusCode(HttpURLConnection.HTTP_INTERNAL_ERROR);
            prediction.setReasonPhrase("Answer over max_response_size");
            prediction.setContentType("application/json");
            prediction.setResp(why.getBytes(StandardCharsets.UTF_8));
        }
    }

    /** Each answer from the backend, on Netty's thread. */
    @ChannelHandler.Sharable
    protected class ResponseHandler extends SimpleChannelInboundHandler<ModelWorkerResponse> {
        @Override
        public void channelRead0(ChannelHandlerContext ctx, ModelWorkerResponse msg) {
            aggregator.sendResponse(msg);
            if (loadingFinished) {
                return;
            }
            if (msg.getCode() == HttpURLConnection.HTTP_OK) {
                logger.info("Worker loaded the model successfully");
                setState(WorkerState.WORKER_MODEL_LOADED, HttpURLConnection.HTTP_OK);
                backoffIdx = 0;
                loadingFinished = true;
                CountDownLatch loaded = latch;
                if (loaded != null) {
                    loaded.countDown();
                }
            } else {
                setState(WorkerState.WORKER_ERROR, msg.getCode());
            }
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            logger.error("Unknown exception", cause);
            ctx.close();
        }
    }
}
